-- Fenced writes: a write that carries a stale fencing token is rejected by
-- the database, atomically, inside the write's own transaction.
--
-- Every rejection raises SQLSTATE PB001 (class PB, "pgbaton", is not used by
-- PostgreSQL). Go maps it to fencedwrite.ErrStaleToken; other clients test
-- for the code. The DETAIL is machine readable and always has this form
-- (name last, because a name may contain anything):
--     presented=<token> current=<token> reason=<word> name=<lease or table>
-- Bad arguments raise 22023 (invalid_parameter_value) instead.

-- raise_stale_token raises the PB001 error. Internal: one place for the
-- message format that fencedwrite parses.
CREATE FUNCTION pgbaton.raise_stale_token(p_name text, p_presented bigint, p_current bigint, p_reason text)
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

-- assert_token returns true when the lease name is held with exactly token
-- and not expired by the database clock; otherwise it raises PB001. It locks
-- the lease row FOR SHARE until the calling transaction ends, so no
-- takeover, renewal or release of the lease can commit before that
-- transaction does: the lease cannot move between this check and the
-- commit. (FOR KEY SHARE would not do: the UPDATE of a takeover takes FOR NO
-- KEY UPDATE, which does not conflict with it.) Use it in any statement:
--     UPDATE accounts SET balance = $3
--      WHERE id = $1 AND pgbaton.assert_token('job:x', $2);
-- or on its own as the first statement of a transaction.
CREATE FUNCTION pgbaton.assert_token(p_name text, p_token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    l_token   bigint;
    l_owner   text;
    l_expires timestamptz;
BEGIN
    IF p_name IS NULL OR p_name = '' OR octet_length(p_name) > 255 THEN
        RAISE EXCEPTION 'pgbaton: lease name must be 1 to 255 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_token IS NULL OR p_token <= 0 THEN
        RAISE EXCEPTION 'pgbaton: fencing token must be positive, got %', p_token USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- READ COMMITTED: if a takeover is in progress this waits for it and
    -- then reads the row as that takeover left it.
    SELECT l.token, l.owner, l.expires_at INTO l_token, l_owner, l_expires
      FROM pgbaton.lease l WHERE l.name = p_name FOR SHARE;
    IF NOT FOUND THEN
        PERFORM pgbaton.raise_stale_token(p_name, p_token, 0, 'unknown lease');
    ELSIF l_token IS NULL OR l_token < p_token THEN
        -- A token this name never had: from another lease, or made up.
        PERFORM pgbaton.raise_stale_token(p_name, p_token, l_token, 'not granted');
    ELSIF l_token > p_token THEN
        PERFORM pgbaton.raise_stale_token(p_name, p_token, l_token, 'superseded');
    ELSIF l_owner IS NULL THEN
        PERFORM pgbaton.raise_stale_token(p_name, p_token, l_token, 'released');
    ELSIF l_expires IS NULL OR l_expires <= clock_timestamp() THEN
        PERFORM pgbaton.raise_stale_token(p_name, p_token, l_token, 'expired');
    END IF;
    RETURN true;
END $$;

COMMENT ON FUNCTION pgbaton.assert_token(text, bigint) IS
    'pgbaton: true if lease (name, token) is held and not expired, else SQLSTATE PB001; locks the lease row FOR SHARE until the transaction ends';

-- reject_stale_token is a BEFORE UPDATE OR DELETE row trigger for tables
-- with a fence_token bigint column (install it with enable_fencing). A row
-- remembers the token of its last writer; a write presenting an older token
-- fails with PB001. An UPDATE presents NEW.fence_token. A DELETE has no new
-- row, so it presents the transaction's setting pgbaton.fence_token:
--     SELECT set_config('pgbaton.fence_token', '42', true);
-- An UPDATE also checks that setting when it is set. A row whose
-- fence_token is NULL is not fenced yet. Writing NULL over a token, or
-- deleting a fenced row without a token, is rejected: fail closed.
CREATE FUNCTION pgbaton.reject_stale_token()
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

-- enable_fencing installs reject_stale_token on a table (or partitioned
-- table) with a fence_token bigint column. Running it again changes
-- nothing. Down-migrating pgbaton fails while tables still use it: run
-- disable_fencing on them first.
CREATE FUNCTION pgbaton.enable_fencing(p_table regclass)
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

-- disable_fencing removes what enable_fencing installed; a no-op when it is
-- not installed.
CREATE FUNCTION pgbaton.disable_fencing(p_table regclass)
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

-- fenced_value is pgbaton's own fenced state: small JSON values (job
-- checkpoints, cursors) that outlive a lease and that only a writer with a
-- token at least as new as the last writer's may change.
CREATE TABLE pgbaton.fenced_value (
    key        text        PRIMARY KEY CHECK (key <> '' AND octet_length(key) <= 255),
    token      bigint      NOT NULL CHECK (token > 0),
    value      jsonb       NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

COMMENT ON TABLE pgbaton.fenced_value IS
    'pgbaton: JSON values written only by writers whose fencing token is not older than the last writer''s';
