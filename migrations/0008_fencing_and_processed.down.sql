-- Back to 0007: the fencing functions as 0004 left them.

DROP FUNCTION pgbaton.prune_processed(interval, integer);
DROP FUNCTION pgbaton.mark_processed(text, text);
DROP TABLE pgbaton.processed_message;

DROP FUNCTION pgbaton.bypass_fencing(regclass, text);
-- NOT VALID keeps the audit rows of past bypasses.
ALTER TABLE pgbaton.event DROP CONSTRAINT event_action_check;
ALTER TABLE pgbaton.event ADD CONSTRAINT event_action_check
    CHECK (action IN ('force_release_lease', 'terminate_advisory_holder')) NOT VALID;

-- Remove the companion trigger from every fenced table (from a partitioned
-- table, which takes its partitions' clones along). Without the privilege
-- this fails, and DROP FUNCTION below says which table still uses it.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT t.tgrelid::regclass AS tbl
               FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
              WHERE t.tgname = 'pgbaton_fence_token_set'
                AND NOT (c.relispartition AND EXISTS (
                        SELECT FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_trigger p ON p.tgrelid = i.inhparent
                         WHERE i.inhrelid = t.tgrelid AND p.tgname = t.tgname))
    LOOP
        EXECUTE format('DROP TRIGGER pgbaton_fence_token_set ON %s', r.tbl);
    END LOOP;
END $$;
DROP FUNCTION pgbaton.fence_token_set();
DROP FUNCTION pgbaton.present_token(bigint);

CREATE OR REPLACE FUNCTION pgbaton.reject_stale_token()
RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    l_name    text;
    l_setting bigint;
BEGIN
    IF TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP NOT IN ('UPDATE', 'DELETE') THEN
        RAISE EXCEPTION 'pgbaton: reject_stale_token must be a BEFORE UPDATE OR DELETE row trigger; use pgbaton.enable_fencing'
            USING ERRCODE = 'invalid_object_definition';
    END IF;
    IF OLD.fence_token IS NULL THEN
        IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
        RETURN NEW;
    END IF;
    l_name := format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME);
    l_setting := nullif(current_setting('pgbaton.fence_token', true), '')::bigint;
    IF TG_OP = 'UPDATE' THEN
        IF NEW.fence_token IS NULL THEN
            PERFORM pgbaton.raise_stale_token(l_name, NULL, OLD.fence_token, 'no token');
        ELSIF NEW.fence_token < OLD.fence_token THEN
            PERFORM pgbaton.raise_stale_token(l_name, NEW.fence_token, OLD.fence_token, 'older than the row''s');
        END IF;
    ELSIF l_setting IS NULL THEN
        PERFORM pgbaton.raise_stale_token(l_name, NULL, OLD.fence_token, 'no token');
    END IF;
    IF l_setting < OLD.fence_token THEN
        PERFORM pgbaton.raise_stale_token(l_name, l_setting, OLD.fence_token, 'older than the row''s');
    END IF;
    IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    RETURN NEW;
END $$;

COMMENT ON FUNCTION pgbaton.reject_stale_token() IS
    'pgbaton: trigger rejecting (SQLSTATE PB001) UPDATE/DELETE of a row with an older fence_token; install with pgbaton.enable_fencing';

DROP FUNCTION pgbaton.fencing_bypassed(oid, text);

CREATE OR REPLACE FUNCTION pgbaton.enable_fencing(p_table regclass)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    l_kind "char";
    l_type regtype;
BEGIN
    IF p_table IS NULL THEN
        RAISE EXCEPTION 'pgbaton: enable_fencing needs a table' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT c.relkind INTO l_kind FROM pg_catalog.pg_class c WHERE c.oid = p_table;
    IF l_kind IS DISTINCT FROM 'r' AND l_kind IS DISTINCT FROM 'p' THEN
        RAISE EXCEPTION 'pgbaton: % is not a table', p_table USING ERRCODE = 'wrong_object_type';
    END IF;
    SELECT a.atttypid::regtype INTO l_type FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = p_table AND a.attname = 'fence_token' AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgbaton: table % has no fence_token column', p_table
            USING ERRCODE = 'undefined_column',
                  HINT = format('ALTER TABLE %s ADD COLUMN fence_token bigint', p_table);
    END IF;
    IF l_type <> 'bigint'::regtype THEN
        RAISE EXCEPTION 'pgbaton: %.fence_token is %, not bigint', p_table, l_type USING ERRCODE = 'datatype_mismatch';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t
                    WHERE t.tgrelid = p_table AND t.tgname = 'pgbaton_reject_stale_token') THEN
        -- regclass prints as a quoted, schema-qualified name when needed.
        EXECUTE format('CREATE TRIGGER pgbaton_reject_stale_token BEFORE UPDATE OR DELETE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION pgbaton.reject_stale_token()', p_table);
    END IF;
END $$;

COMMENT ON FUNCTION pgbaton.enable_fencing(regclass) IS
    'pgbaton: install the reject_stale_token trigger on a table with a fence_token bigint column';

CREATE OR REPLACE FUNCTION pgbaton.disable_fencing(p_table regclass)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_table IS NULL THEN
        RAISE EXCEPTION 'pgbaton: disable_fencing needs a table' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS pgbaton_reject_stale_token ON %s', p_table);
END $$;

COMMENT ON FUNCTION pgbaton.disable_fencing(regclass) IS
    'pgbaton: remove the reject_stale_token trigger that enable_fencing installed';

CREATE OR REPLACE FUNCTION pgbaton.raise_stale_token(p_name text, p_presented bigint, p_current bigint, p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pgbaton: stale fencing token for %: presented %, current % (%)',
            p_name, coalesce(p_presented, 0), coalesce(p_current, 0), p_reason
        USING ERRCODE = 'PB001',
              DETAIL = format('presented=%s current=%s reason=%s name=%s',
                              coalesce(p_presented, 0), coalesce(p_current, 0), p_reason, p_name),
              HINT = 'The lock was lost or taken over: stop working under this token and do not retry with it.';
END $$;
