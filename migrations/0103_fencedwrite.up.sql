-- Fenced writes: a write that carries a stale fencing token is rejected by
-- the database, atomically, inside the write's own transaction.
--
-- Every rejection raises SQLSTATE PB001 (class PB, "pgbaton", is not used by
-- PostgreSQL). Go maps it to fencedwrite.ErrStaleToken; other clients test
-- for the code. The DETAIL is machine readable and always has this form
-- (name last, because a name may contain anything):
--     presented=<token> current=<token> reason=<word> name=<lease or table>
-- Bad arguments raise 22023 (invalid_parameter_value) instead.

-- A write to a fenced row must carry a token: an UPDATE that leaves
-- fence_token alone is refused, and pgbaton.present_token gives the
-- transaction's token from inside any statement. pgbaton.bypass_fencing is
-- an operator's audited way past the fence. The idempotent consumer
-- (pgbaton.processed_message, mark_processed, prune_processed) lives here
-- too: it is the other half of an effect done once.

-- raise_stale_token raises the PB001 error. Internal: the one place that
-- writes the message fencedwrite parses. The DETAIL keeps its form; the
-- message reads right when there is no lease row or no token. A lease row
-- that does not exist (leasetable deletes the row of a completed work
-- item) is reason "no such lease": assert_token says "unknown lease",
-- translated here.
CREATE FUNCTION pgbaton.raise_stale_token(p_name text, p_presented bigint, p_current bigint, p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    l_message text;
    l_hint    text := 'The lock was lost or taken over: stop working under this token and do not retry with it.';
BEGIN
    IF p_reason = 'unknown lease' THEN
        p_reason := 'no such lease';
    END IF;
    IF p_reason = 'no token' THEN
        l_hint := 'Present the writer''s token: assign fence_token, or pgbaton.present_token(token) in the transaction.';
    END IF;
    IF p_reason = 'no such lease' THEN
        l_message := format('pgbaton: stale fencing token for %s: presented %s, no such lease (completed, or never granted)',
                            p_name, coalesce(p_presented, 0));
    ELSIF p_presented IS NULL THEN
        l_message := format('pgbaton: stale fencing token for %s: none presented, current %s (%s)',
                            p_name, coalesce(p_current, 0), p_reason);
    ELSE
        l_message := format('pgbaton: stale fencing token for %s: presented %s, current %s (%s)',
                            p_name, p_presented, coalesce(p_current, 0), p_reason);
    END IF;
    RAISE EXCEPTION USING MESSAGE = l_message,
              ERRCODE = 'PB001',
              DETAIL = format('presented=%s current=%s reason=%s name=%s',
                              coalesce(p_presented, 0), coalesce(p_current, 0), p_reason, p_name),
              HINT = l_hint;
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
-- A lease bound to a session counts as held while the session is alive.
CREATE FUNCTION pgbaton.assert_token(p_name text, p_token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
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
    SELECT l.token, l.owner, pgbaton.lease_expiry(l.expires_at, pgbaton.session_expiry(l.session_id))
      INTO l_token, l_owner, l_expires
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

-- present_token sets the token that the rest of the calling transaction
-- presents to fenced tables (the setting pgbaton.fence_token) and returns
-- true, so that one statement can carry its own token:
--     DELETE FROM orders WHERE id = $1 AND pgbaton.present_token($2);
-- A row only passes the WHERE clause after the function has run, so the
-- token is set before the row's trigger fires.
CREATE FUNCTION pgbaton.present_token(p_token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_token IS NULL OR p_token <= 0 THEN
        RAISE EXCEPTION 'pgbaton: fencing token must be positive, got %', p_token USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('pgbaton.fence_token', p_token::text, true);
    RETURN true;
END $$;

COMMENT ON FUNCTION pgbaton.present_token(bigint) IS
    'pgbaton: present this fencing token to fenced tables for the rest of the transaction; returns true (use in WHERE)';

-- fence_token_set is the companion of reject_stale_token, installed as
-- BEFORE UPDATE OF fence_token: PostgreSQL fires it only for statements
-- that assign fence_token, which is how a write presents the row's own
-- token again ("SET ..., fence_token = 7" on a row at 7), something a row
-- trigger cannot see in NEW alone. It leaves a mark for this row (table
-- and token) that reject_stale_token, firing next (trigger names sort
-- "pgbaton_fence..." before "pgbaton_reject..."), consumes.
CREATE FUNCTION pgbaton.fence_token_set()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'UPDATE' THEN
        RAISE EXCEPTION 'pgbaton: fence_token_set must be a BEFORE UPDATE OF fence_token row trigger; use pgbaton.enable_fencing'
            USING ERRCODE = 'invalid_object_definition';
    END IF;
    PERFORM set_config('pgbaton.fence_token_set', TG_RELID::text || ':' || coalesce(NEW.fence_token::text, ''), true);
    RETURN NEW;
END $$;

COMMENT ON FUNCTION pgbaton.fence_token_set() IS
    'pgbaton: trigger marking an UPDATE that assigns fence_token; installed with reject_stale_token by pgbaton.enable_fencing';

-- fencing_bypassed reports whether one of the audit events listed in the
-- setting pgbaton.fence_bypass was written by pgbaton.bypass_fencing in
-- this very transaction for this table (or a partitioned table it belongs
-- to). Setting pgbaton.fence_bypass by hand therefore bypasses nothing.
-- SECURITY DEFINER: writers of fenced tables need not read the audit log
-- (it only answers yes or no).
CREATE FUNCTION pgbaton.fencing_bypassed(p_relid oid, p_events text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN EXISTS (
        SELECT FROM pgbaton.event e
         WHERE e.id = ANY (string_to_array(p_events, ',')::bigint[])
           AND e.action = 'bypass_fencing'
           AND e.detail->>'xid' = txid_current()::text
           AND (e.detail->>'relid')::oid IN (SELECT p_relid UNION ALL SELECT a.relid FROM pg_partition_ancestors(p_relid) a));
END $$;

-- reject_stale_token is the fence of a table with a fence_token bigint
-- column (BEFORE UPDATE OR DELETE, per row; install with enable_fencing).
-- A row remembers the token of its last writer. A write to a row whose
-- fence_token is not NULL must present a token not older than the row's:
--   * the transaction's token, the setting pgbaton.fence_token (SetToken
--     in Go, SET LOCAL pgbaton.fence_token, or pgbaton.present_token in
--     the statement), for UPDATE and DELETE; or
--   * for UPDATE, the new fence_token the statement assigns: a newer
--     token, or the row's own one assigned again (fence_token_set marks
--     that case).
-- An UPDATE presenting no token, or writing NULL over a token, or a
-- DELETE without a transaction token fails with reason "no token". An
-- UPDATE leaves the newest token presented in the row. A row whose
-- fence_token is NULL is not fenced yet; a transaction token fences it.
-- An operator's bypass_fencing lets the rest of the transaction write the
-- table with no token at all, tokens unchanged.
CREATE FUNCTION pgbaton.reject_stale_token()
RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    l_name    text;
    l_setting bigint;
    l_mark    text;
    l_bypass  text;
BEGIN
    IF TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP NOT IN ('UPDATE', 'DELETE') THEN
        RAISE EXCEPTION 'pgbaton: reject_stale_token must be a BEFORE UPDATE OR DELETE row trigger; use pgbaton.enable_fencing'
            USING ERRCODE = 'invalid_object_definition';
    END IF;
    IF TG_OP = 'UPDATE' THEN
        -- Consume fence_token_set's mark, so that it counts for this row
        -- only.
        l_mark := current_setting('pgbaton.fence_token_set', true);
        IF l_mark <> '' THEN
            PERFORM set_config('pgbaton.fence_token_set', '', true);
        END IF;
    END IF;
    l_setting := nullif(current_setting('pgbaton.fence_token', true), '')::bigint;
    IF l_setting <= 0 THEN
        RAISE EXCEPTION 'pgbaton: pgbaton.fence_token must be a positive fencing token, got %', l_setting
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF OLD.fence_token IS NULL THEN
        IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
        IF l_setting > NEW.fence_token OR (NEW.fence_token IS NULL AND l_setting IS NOT NULL) THEN
            NEW.fence_token := l_setting;
        END IF;
        RETURN NEW;
    END IF;
    -- Look up the audit log only when a bypass was asked for (a NULL
    -- would not stop AND from calling the function).
    l_bypass := coalesce(current_setting('pgbaton.fence_bypass', true), '');
    IF l_bypass <> '' THEN
        IF pgbaton.fencing_bypassed(TG_RELID, l_bypass) THEN
            IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
            RETURN NEW;
        END IF;
    END IF;
    l_name := format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME);
    IF TG_OP = 'DELETE' THEN
        IF l_setting IS NULL THEN
            PERFORM pgbaton.raise_stale_token(l_name, NULL, OLD.fence_token, 'no token');
        ELSIF l_setting < OLD.fence_token THEN
            PERFORM pgbaton.raise_stale_token(l_name, l_setting, OLD.fence_token, 'older than the row''s');
        END IF;
        RETURN OLD;
    END IF;
    IF NEW.fence_token IS NULL THEN
        PERFORM pgbaton.raise_stale_token(l_name, NULL, OLD.fence_token, 'no token');
    ELSIF NEW.fence_token < OLD.fence_token THEN
        PERFORM pgbaton.raise_stale_token(l_name, NEW.fence_token, OLD.fence_token, 'older than the row''s');
    ELSIF NEW.fence_token = OLD.fence_token AND l_setting IS NULL
          AND l_mark IS DISTINCT FROM (TG_RELID::text || ':' || NEW.fence_token::text) THEN
        -- fence_token unchanged and not assigned: the write carries none.
        PERFORM pgbaton.raise_stale_token(l_name, NULL, OLD.fence_token, 'no token');
    END IF;
    IF l_setting < OLD.fence_token THEN
        PERFORM pgbaton.raise_stale_token(l_name, l_setting, OLD.fence_token, 'older than the row''s');
    END IF;
    IF l_setting > NEW.fence_token THEN
        NEW.fence_token := l_setting; -- only then: assigning to NEW copies the row
    END IF;
    RETURN NEW;
END $$;

COMMENT ON FUNCTION pgbaton.reject_stale_token() IS
    'pgbaton: trigger rejecting (SQLSTATE PB001) UPDATE/DELETE of a fenced row without a token or with one older than the row''s; install with pgbaton.enable_fencing';

-- enable_fencing installs reject_stale_token on a table (or partitioned
-- table) with a fence_token bigint column. Running it again changes
-- nothing. Down-migrating pgbaton fails while tables still use it: run
-- disable_fencing on them first. It installs both triggers (each only if
-- missing): reject_stale_token and fence_token_set.
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
    -- regclass prints as a quoted, schema-qualified name when needed.
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t
                    WHERE t.tgrelid = p_table AND t.tgname = 'pgbaton_fence_token_set') THEN
        EXECUTE format('CREATE TRIGGER pgbaton_fence_token_set BEFORE UPDATE OF fence_token ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION pgbaton.fence_token_set()', p_table);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t
                    WHERE t.tgrelid = p_table AND t.tgname = 'pgbaton_reject_stale_token') THEN
        EXECUTE format('CREATE TRIGGER pgbaton_reject_stale_token BEFORE UPDATE OR DELETE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION pgbaton.reject_stale_token()', p_table);
    END IF;
END $$;

COMMENT ON FUNCTION pgbaton.enable_fencing(regclass) IS
    'pgbaton: install the fencing triggers (reject_stale_token, fence_token_set) on a table with a fence_token bigint column';

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
    EXECUTE format('DROP TRIGGER IF EXISTS pgbaton_fence_token_set ON %s', p_table);
END $$;

COMMENT ON FUNCTION pgbaton.disable_fencing(regclass) IS
    'pgbaton: remove the fencing triggers that enable_fencing installed';

-- bypass_fencing lets the rest of the calling transaction write p_table
-- without a token: the operator's way to correct data in a fenced table
-- without making up a token (a made-up large one would lock every holder
-- out of the row for good). Needs pgbaton_admin and a reason; writes the
-- audit row (the transaction id and the table in detail) in the same
-- transaction, so a bypass that rolls back leaves no trace and no effect.
-- Rows keep their tokens. Returns the event's id.
CREATE FUNCTION pgbaton.bypass_fencing(p_table regclass, p_reason text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    l_id bigint;
BEGIN
    PERFORM pgbaton.require_admin('bypassing the fence of a table');
    IF p_reason IS NULL OR btrim(p_reason) = '' THEN
        RAISE EXCEPTION 'pgbaton: bypassing the fence needs a reason' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_table IS NULL OR NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t
                                       WHERE t.tgrelid = p_table AND t.tgname = 'pgbaton_reject_stale_token') THEN
        RAISE EXCEPTION 'pgbaton: % is not fenced', p_table USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pgbaton.event (action, target, reason, detail)
    VALUES ('bypass_fencing', p_table::text, p_reason,
            jsonb_build_object('xid', txid_current()::text, 'relid', p_table::oid, 'pid', pg_backend_pid(),
                               'application_name', current_setting('application_name')))
    RETURNING id INTO l_id;
    PERFORM set_config('pgbaton.fence_bypass',
                       concat_ws(',', nullif(current_setting('pgbaton.fence_bypass', true), ''), l_id::text), true);
    RETURN l_id;
END $$;

COMMENT ON FUNCTION pgbaton.bypass_fencing(regclass, text) IS
    'pgbaton: let the rest of this transaction write a fenced table without a token; pgbaton_admin only, audited in pgbaton.event';

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

CREATE INDEX fenced_value_updated_idx ON pgbaton.fenced_value (updated_at);

-- The idempotent consumer: one row per message (or request) a consumer
-- has processed, written in the transaction that does the message's
-- work, so the work and the record commit together or not at all.
CREATE TABLE pgbaton.processed_message (
    consumer     text        NOT NULL CHECK (consumer <> '' AND octet_length(consumer) <= 255),
    message_id   text        NOT NULL CHECK (message_id <> '' AND octet_length(message_id) <= 255),
    processed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (consumer, message_id)
);

-- Retention deletes the oldest rows first.
CREATE INDEX processed_message_processed_at_idx ON pgbaton.processed_message (processed_at);

COMMENT ON TABLE pgbaton.processed_message IS
    'pgbaton: messages each consumer has processed (idempotent consumer); pruned by pgbaton.prune_processed';

-- mark_processed records (consumer, message id) in the calling
-- transaction. A repeat raises SQLSTATE PB409, which aborts the
-- transaction, so the repeat's work cannot commit even if the caller
-- ignores the error. A concurrent delivery of the same message waits for
-- the first transaction: if it commits, PB409; if it rolls back, the
-- second one goes ahead. Call it before the work.
CREATE FUNCTION pgbaton.mark_processed(p_consumer text, p_message_id text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    l_at timestamptz;
BEGIN
    IF p_consumer IS NULL OR p_consumer = '' OR octet_length(p_consumer) > 255 THEN
        RAISE EXCEPTION 'pgbaton: consumer must be 1 to 255 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_message_id IS NULL OR p_message_id = '' OR octet_length(p_message_id) > 255 THEN
        RAISE EXCEPTION 'pgbaton: message id must be 1 to 255 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pgbaton.processed_message (consumer, message_id) VALUES (p_consumer, p_message_id)
    ON CONFLICT (consumer, message_id) DO NOTHING;
    IF NOT FOUND THEN
        SELECT p.processed_at INTO l_at FROM pgbaton.processed_message p
         WHERE p.consumer = p_consumer AND p.message_id = p_message_id;
        RAISE EXCEPTION 'pgbaton: consumer % already processed message %', p_consumer, p_message_id
            USING ERRCODE = 'PB409',
                  DETAIL = format('processed_at=%s', coalesce(l_at::text, 'unknown')),
                  HINT = 'Skip the message: acknowledge it without doing its work again.';
    END IF;
END $$;

COMMENT ON FUNCTION pgbaton.mark_processed(text, text) IS
    'pgbaton: record a processed message in this transaction; SQLSTATE PB409 (and the transaction aborted) if it was already';

-- prune_processed deletes up to p_batch records older than p_older_than
-- (by the database clock), oldest first, and returns how many. Call it
-- again until it returns less than p_batch; small batches keep each
-- transaction short. Concurrent calls skip each other's rows. A message
-- redelivered after its record was pruned is processed again, so keep
-- records longer than the longest redelivery (7 days by default).
CREATE FUNCTION pgbaton.prune_processed(p_older_than interval DEFAULT interval '7 days', p_batch integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    n integer;
BEGIN
    IF p_older_than IS NULL OR p_older_than <= interval '0' THEN
        RAISE EXCEPTION 'pgbaton: retention must be positive, got %', p_older_than USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
        RAISE EXCEPTION 'pgbaton: batch must be 1 to 100000, got %', p_batch USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM pgbaton.processed_message p
     USING (SELECT q.consumer, q.message_id FROM pgbaton.processed_message q
             WHERE q.processed_at < clock_timestamp() - p_older_than
             ORDER BY q.processed_at
             LIMIT p_batch
               FOR UPDATE SKIP LOCKED) old
     WHERE p.consumer = old.consumer AND p.message_id = old.message_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

COMMENT ON FUNCTION pgbaton.prune_processed(interval, integer) IS
    'pgbaton: delete up to p_batch processed_message rows older than p_older_than; returns the count';

UPDATE pgbaton.schema_version SET version = 103;
