-- Back to per-lease expiry (migrations 0003-0007).
DROP VIEW pgbaton.lease_status;
DROP FUNCTION pgbaton.session_lost(bigint, text[], bigint[], text);
DROP FUNCTION pgbaton.settle_many(text[], bigint[], text);
DROP FUNCTION pgbaton.release_ref(text, bigint, uuid);
DROP FUNCTION pgbaton.session_close(bigint);
DROP FUNCTION pgbaton.session_keepalive(bigint, bigint);
DROP FUNCTION pgbaton.session_open(text, bigint);
DROP FUNCTION pgbaton.prune_sessions(interval, integer);
DROP FUNCTION pgbaton.try_acquire(text, text, bigint);
DROP FUNCTION pgbaton.lease_attempt(text, text, bigint, jsonb, bigint, uuid);
DROP FUNCTION pgbaton.claim(text, text, integer, bigint, bigint, uuid, boolean);


CREATE FUNCTION pgbaton.lease_attempt(p_name text, p_owner text, p_ttl_ms bigint, p_metadata jsonb DEFAULT NULL,
    OUT acquired boolean, OUT token bigint, OUT expires_at timestamptz, OUT holder text, OUT db_now timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    cur pgbaton.lease%ROWTYPE;
    t   timestamptz;
BEGIN
    PERFORM pgbaton.lease_check_args(p_name, p_owner, p_ttl_ms);
    LOOP
        -- Look before locking: an attempt on a live lease takes no row lock
        -- and no transaction id, so contended attempts write no WAL.
        SELECT * INTO cur FROM pgbaton.lease l WHERE l.name = p_name;
        IF NOT FOUND THEN
            INSERT INTO pgbaton.lease (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING;
        ELSIF cur.owner IS NOT NULL AND cur.expires_at > clock_timestamp() THEN
            acquired := false; token := cur.token; expires_at := cur.expires_at; holder := cur.owner;
            db_now := clock_timestamp();
            RETURN;
        END IF;
        -- The token is drawn only while this row lock is held, so grants of
        -- a name get strictly increasing tokens in the order they happen.
        SELECT * INTO cur FROM pgbaton.lease l WHERE l.name = p_name FOR UPDATE;
        EXIT WHEN FOUND; -- else deleted under us (complete): go round again
    END LOOP;
    t := clock_timestamp();
    IF cur.owner IS NOT NULL AND cur.expires_at > t THEN
        acquired := false; token := cur.token; expires_at := cur.expires_at; holder := cur.owner; db_now := t;
        RETURN;
    END IF;
    UPDATE pgbaton.lease l
       SET owner = p_owner, token = nextval('pgbaton.lease_token_seq'),
           acquired_at = t, renewed_at = t, expires_at = t + p_ttl_ms * interval '1 millisecond',
           metadata = coalesce(p_metadata, l.metadata)
     WHERE l.name = p_name
    RETURNING l.token, l.expires_at INTO token, expires_at;
    acquired := true; holder := p_owner; db_now := t;
END $$;

ALTER FUNCTION pgbaton.lease_attempt(text, text, bigint, jsonb) SET enable_seqscan = off;

CREATE FUNCTION pgbaton.try_acquire(p_name text, p_owner text, p_ttl_ms bigint)
RETURNS TABLE (token bigint, expires_at timestamptz)
LANGUAGE sql AS $$
    SELECT a.token, a.expires_at FROM pgbaton.lease_attempt(p_name, p_owner, p_ttl_ms) a WHERE a.acquired
$$;

CREATE OR REPLACE FUNCTION pgbaton.renew(p_name text, p_owner text, p_token bigint, p_ttl_ms bigint)
RETURNS TABLE (expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz;
BEGIN
    PERFORM pgbaton.lease_check_args(p_name, p_owner, p_ttl_ms);
    t := clock_timestamp();
    RETURN QUERY
    UPDATE pgbaton.lease l
       SET renewed_at = t, expires_at = t + p_ttl_ms * interval '1 millisecond'
     WHERE l.name = p_name AND l.owner = p_owner AND l.token = p_token AND l.expires_at > t
    RETURNING l.expires_at;
END $$;

CREATE OR REPLACE FUNCTION pgbaton.release(p_name text, p_owner text, p_token bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    g text;
BEGIN
    PERFORM pgbaton.lease_check_args(p_name, p_owner, 1);
    UPDATE pgbaton.lease l
       SET owner = NULL, expires_at = NULL
     WHERE l.name = p_name AND l.owner = p_owner AND l.token = p_token
    RETURNING l.lease_group INTO g;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT 1 FROM pgbaton.lease_waiter w WHERE w.name = p_name) THEN
        PERFORM pg_notify('pgbaton_lease', p_name);
    END IF;
    IF g IS NOT NULL AND EXISTS (SELECT 1 FROM pgbaton.lease_waiter w WHERE w.name = g) THEN
        PERFORM pg_notify('pgbaton_lease', g);
    END IF;
    RETURN true;
END $$;

ALTER FUNCTION pgbaton.renew(text, text, bigint, bigint) SET enable_seqscan = off;
ALTER FUNCTION pgbaton.release(text, text, bigint) SET enable_seqscan = off;

CREATE OR REPLACE FUNCTION pgbaton.release_many(p_names text[], p_tokens bigint[], p_owner text)
RETURNS SETOF text
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        UPDATE pgbaton.lease l
           SET owner = NULL, expires_at = NULL
         WHERE l.name = ANY (p_names) AND l.token = ANY (p_tokens) AND l.owner = p_owner
        RETURNING l.name, l.lease_group
    LOOP
        IF EXISTS (SELECT 1 FROM pgbaton.lease_waiter w WHERE w.name = r.name) THEN
            PERFORM pg_notify('pgbaton_lease', r.name);
        END IF;
        IF r.lease_group IS NOT NULL AND EXISTS (SELECT 1 FROM pgbaton.lease_waiter w WHERE w.name = r.lease_group) THEN
            PERFORM pg_notify('pgbaton_lease', r.lease_group);
        END IF;
        RETURN NEXT r.name;
    END LOOP;
END $$;

CREATE FUNCTION pgbaton.claim(p_group text, p_owner text, p_n integer, p_ttl_ms bigint)
RETURNS TABLE (name text, token bigint, expires_at timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    t      timestamptz;
    picked text[];
BEGIN
    PERFORM pgbaton.lease_check_args(p_group, p_owner, p_ttl_ms);
    IF p_n IS NULL OR p_n <= 0 THEN
        RAISE EXCEPTION 'pgbaton: claim n must be positive, got %', p_n USING ERRCODE = 'invalid_parameter_value';
    END IF;
    t := clock_timestamp();
    -- The oldest n free rows and the oldest n expired ones, each locked as
    -- it is found; the oldest n of both are granted. Rows locked but not
    -- granted stay as they were and are unlocked when this call's
    -- transaction ends.
    WITH free AS (
        SELECT l.name, l.seq FROM pgbaton.lease l
         WHERE l.lease_group = p_group AND l.owner IS NULL
         ORDER BY l.seq LIMIT p_n FOR UPDATE SKIP LOCKED
    ), expired AS (
        SELECT l.name, l.seq FROM pgbaton.lease l
         WHERE l.lease_group = p_group AND l.owner IS NOT NULL AND l.expires_at <= t
         ORDER BY l.seq LIMIT p_n FOR UPDATE SKIP LOCKED
    )
    SELECT array_agg(c.name ORDER BY c.seq) INTO picked
      FROM (SELECT a.name, a.seq FROM (SELECT * FROM free UNION ALL SELECT * FROM expired) a
             ORDER BY a.seq LIMIT p_n) c;
    IF picked IS NULL THEN
        RETURN;
    END IF;
    t := clock_timestamp();
    -- The rows are locked by the selects above, so each token is drawn under
    -- its row's lock.
    RETURN QUERY
    WITH granted AS (
        UPDATE pgbaton.lease l
           SET owner = p_owner, token = nextval('pgbaton.lease_token_seq'),
               acquired_at = t, renewed_at = t, expires_at = t + p_ttl_ms * interval '1 millisecond'
         WHERE l.name = ANY (picked)
        RETURNING l.name, l.token, l.expires_at, l.seq)
    SELECT g.name, g.token, g.expires_at FROM granted g ORDER BY g.seq;
END $$;

CREATE OR REPLACE FUNCTION pgbaton.assert_token(p_name text, p_token bigint)
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

ALTER FUNCTION pgbaton.assert_token(text, bigint) SET enable_seqscan = off;

CREATE OR REPLACE FUNCTION pgbaton.force_release_lease(p_name text, p_reason text)
RETURNS TABLE (old_owner text, old_token bigint, new_token bigint)
LANGUAGE plpgsql AS $$
DECLARE
    cur pgbaton.lease%ROWTYPE;
BEGIN
    PERFORM pgbaton.require_admin('force-releasing a lease');
    PERFORM pgbaton.require_reason(p_reason);
    SELECT * INTO cur FROM pgbaton.lease l WHERE l.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgbaton: no lease named %', p_name USING ERRCODE = 'PB404';
    END IF;
    IF cur.owner IS NULL OR cur.expires_at <= clock_timestamp() THEN
        RAISE EXCEPTION 'pgbaton: lease % is not held', p_name USING ERRCODE = 'PB404';
    END IF;
    UPDATE pgbaton.lease l
       SET owner = NULL, expires_at = NULL, token = nextval('pgbaton.lease_token_seq')
     WHERE l.name = p_name
    RETURNING l.token INTO new_token;
    old_owner := cur.owner;
    old_token := cur.token;
    INSERT INTO pgbaton.event (action, target, reason, old_token, new_token, detail)
    VALUES ('force_release_lease', p_name, p_reason, cur.token, new_token,
            jsonb_build_object('owner', cur.owner, 'group', cur.lease_group,
                               'acquired_at', cur.acquired_at, 'expires_at', cur.expires_at));
    PERFORM pg_notify('pgbaton_lease', p_name);
    RETURN NEXT;
END $$;

ALTER FUNCTION pgbaton.force_release_lease(text, text) SET enable_seqscan = off;

CREATE OR REPLACE FUNCTION pgbaton.grant_roles()
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgbaton_reader')
       OR NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgbaton_admin') THEN
        RAISE NOTICE 'pgbaton: roles pgbaton_reader and pgbaton_admin do not exist; no grants made';
        RETURN;
    END IF;
    GRANT USAGE ON SCHEMA pgbaton TO pgbaton_reader;
    GRANT SELECT ON ALL TABLES IN SCHEMA pgbaton TO pgbaton_reader;
    GRANT UPDATE ON pgbaton.lease TO pgbaton_admin;
    GRANT INSERT ON pgbaton.event TO pgbaton_admin;
    GRANT USAGE ON SEQUENCE pgbaton.lease_token_seq TO pgbaton_admin;
    BEGIN
        GRANT pgbaton_reader TO pgbaton_admin;
        GRANT pg_read_all_stats TO pgbaton_reader;
        GRANT pg_signal_backend TO pgbaton_admin;
    EXCEPTION WHEN insufficient_privilege OR invalid_grant_operation THEN
        RAISE NOTICE 'pgbaton: could not grant role memberships (%); a DBA should run SELECT pgbaton.grant_roles()', SQLERRM;
    END;
END $$;

DROP FUNCTION pgbaton.session_of(bigint, text);
DROP FUNCTION pgbaton.lease_expiry(timestamptz, bigint);
DROP INDEX pgbaton.lease_session_idx;
DROP INDEX pgbaton.lease_held_idx;
CREATE INDEX lease_held_idx ON pgbaton.lease (lease_group, seq)
    WHERE lease_group IS NOT NULL AND owner IS NOT NULL;
ALTER TABLE pgbaton.lease DROP COLUMN session_id;
ALTER TABLE pgbaton.lease DROP COLUMN grant_ref;
DROP TABLE pgbaton.lease_session;
