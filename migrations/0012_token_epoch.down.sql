-- Back to tokens from the sequence alone. The sequence first moves past
-- every token drawn with an epoch, so tokens keep growing.
SELECT setval('pgbaton.lease_token_seq', e.epoch * 1099511627776 + s.last_value, s.is_called)
  FROM pgbaton.token_epoch e, pgbaton.lease_token_seq s;

-- The functions as migration 0011 made them.
CREATE OR REPLACE FUNCTION pgbaton.lease_attempt(p_name text, p_owner text, p_ttl_ms bigint, p_metadata jsonb DEFAULT NULL,
    p_session bigint DEFAULT NULL, p_ref uuid DEFAULT NULL,
    OUT acquired boolean, OUT token bigint, OUT expires_at timestamptz, OUT holder text, OUT db_now timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    cur pgbaton.lease%ROWTYPE;
    t   timestamptz;
    sid bigint;
BEGIN
    PERFORM pgbaton.lease_check_args(p_name, p_owner, p_ttl_ms);
    sid := pgbaton.session_of(p_session, p_owner);
    LOOP
        -- Look before locking: an attempt on a live lease takes no row lock
        -- and no transaction id, so contended attempts write no WAL.
        SELECT * INTO cur FROM pgbaton.lease l WHERE l.name = p_name;
        IF NOT FOUND THEN
            INSERT INTO pgbaton.lease (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING;
        ELSIF cur.owner IS NOT NULL AND pgbaton.lease_expiry(cur.expires_at, cur.session_id) > clock_timestamp() THEN
            -- A request sent again finds the grant it made.
            acquired := coalesce(cur.grant_ref = p_ref AND cur.owner = p_owner, false);
            token := cur.token; holder := cur.owner;
            expires_at := CASE WHEN acquired THEN cur.expires_at
                               ELSE pgbaton.lease_expiry(cur.expires_at, cur.session_id) END;
            db_now := clock_timestamp();
            RETURN;
        END IF;
        -- The token is drawn only while this row lock is held, so grants of
        -- a name get strictly increasing tokens in the order they happen.
        SELECT * INTO cur FROM pgbaton.lease l WHERE l.name = p_name FOR UPDATE;
        EXIT WHEN FOUND; -- else deleted under us (complete): go round again
    END LOOP;
    t := clock_timestamp();
    IF cur.owner IS NOT NULL AND pgbaton.lease_expiry(cur.expires_at, cur.session_id) > t THEN
        acquired := coalesce(cur.grant_ref = p_ref AND cur.owner = p_owner, false);
        token := cur.token; holder := cur.owner; db_now := t;
        expires_at := CASE WHEN acquired THEN cur.expires_at
                           ELSE pgbaton.lease_expiry(cur.expires_at, cur.session_id) END;
        RETURN;
    END IF;
    UPDATE pgbaton.lease l
       SET owner = p_owner, token = nextval('pgbaton.lease_token_seq'), session_id = sid, grant_ref = p_ref,
           acquired_at = t, renewed_at = t, expires_at = t + p_ttl_ms * interval '1 millisecond',
           metadata = coalesce(p_metadata, l.metadata)
     WHERE l.name = p_name
    RETURNING l.token, l.expires_at INTO token, expires_at;
    acquired := true; holder := p_owner; db_now := t;
END $$;

CREATE OR REPLACE FUNCTION pgbaton.claim(p_group text, p_owner text, p_n integer, p_ttl_ms bigint, p_session bigint DEFAULT NULL,
    p_ref uuid DEFAULT NULL, p_retry boolean DEFAULT false)
RETURNS TABLE (name text, token bigint, expires_at timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    t      timestamptz;
    picked text[];
    sid    bigint;
BEGIN
    PERFORM pgbaton.lease_check_args(p_group, p_owner, p_ttl_ms);
    sid := pgbaton.session_of(p_session, p_owner);
    IF p_n IS NULL OR p_n <= 0 THEN
        RAISE EXCEPTION 'pgbaton: claim n must be positive, got %', p_n USING ERRCODE = 'invalid_parameter_value';
    END IF;
    t := clock_timestamp();
    IF p_retry AND p_ref IS NOT NULL THEN
        -- The request is sent again: if the first one was granted, return
        -- what it got rather than claim more.
        RETURN QUERY
        SELECT l.name, l.token, l.expires_at FROM pgbaton.lease l
         WHERE l.session_id IS NOT DISTINCT FROM sid AND l.grant_ref = p_ref AND l.owner = p_owner
           AND l.lease_group = p_group AND pgbaton.lease_expiry(l.expires_at, l.session_id) > t
         ORDER BY l.seq;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    -- The oldest n free rows, the oldest n expired rows without a session,
    -- and the oldest n of each dead session, each locked as it is found;
    -- the oldest n of all are granted. Rows locked but not granted stay as
    -- they were and are unlocked when this call's transaction ends. A dead
    -- session never comes back, so reading the sessions unlocked is safe.
    WITH free AS (
        SELECT l.name, l.seq FROM pgbaton.lease l
         WHERE l.lease_group = p_group AND l.owner IS NULL
         ORDER BY l.seq LIMIT p_n FOR UPDATE SKIP LOCKED
    ), expired AS (
        SELECT l.name, l.seq FROM pgbaton.lease l
         WHERE l.lease_group = p_group AND l.owner IS NOT NULL AND l.session_id IS NULL AND l.expires_at <= t
         ORDER BY l.seq LIMIT p_n FOR UPDATE SKIP LOCKED
    ), dead AS (
        SELECT e.name, e.seq
          FROM pgbaton.lease_session s
         CROSS JOIN LATERAL (
            SELECT l.name, l.seq FROM pgbaton.lease l
             WHERE l.lease_group = p_group AND l.owner IS NOT NULL AND l.session_id = s.id AND l.expires_at <= t
             ORDER BY l.seq LIMIT p_n FOR UPDATE SKIP LOCKED) e
         WHERE s.expires_at <= t
    )
    SELECT array_agg(c.name ORDER BY c.seq) INTO picked
      FROM (SELECT a.name, a.seq
              FROM (SELECT * FROM free UNION ALL SELECT * FROM expired UNION ALL SELECT * FROM dead) a
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
           SET owner = p_owner, token = nextval('pgbaton.lease_token_seq'), session_id = sid, grant_ref = p_ref,
               acquired_at = t, renewed_at = t, expires_at = t + p_ttl_ms * interval '1 millisecond'
         WHERE l.name = ANY (picked)
        RETURNING l.name, l.token, l.expires_at, l.seq)
    SELECT g.name, g.token, g.expires_at FROM granted g ORDER BY g.seq;
END $$;

CREATE OR REPLACE FUNCTION pgbaton.force_release_lease(p_name text, p_reason text)
RETURNS TABLE (old_owner text, old_token bigint, new_token bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    cur pgbaton.lease%ROWTYPE;
BEGIN
    PERFORM pgbaton.require_admin('force-releasing a lease');
    PERFORM pgbaton.require_reason(p_reason);
    SELECT * INTO cur FROM pgbaton.lease l WHERE l.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgbaton: no lease named %', p_name USING ERRCODE = 'PB404';
    END IF;
    IF cur.owner IS NULL OR pgbaton.lease_expiry(cur.expires_at, cur.session_id) <= clock_timestamp() THEN
        RAISE EXCEPTION 'pgbaton: lease % is not held', p_name USING ERRCODE = 'PB404';
    END IF;
    UPDATE pgbaton.lease l
       SET owner = NULL, expires_at = NULL, session_id = NULL, token = nextval('pgbaton.lease_token_seq')
     WHERE l.name = p_name
    RETURNING l.token INTO new_token;
    IF cur.session_id IS NOT NULL THEN
        UPDATE pgbaton.lease_session s SET revoked = s.revoked + 1 WHERE s.id = cur.session_id;
    END IF;
    old_owner := cur.owner;
    old_token := cur.token;
    INSERT INTO pgbaton.event (action, target, reason, old_token, new_token, detail)
    VALUES ('force_release_lease', p_name, p_reason, cur.token, new_token,
            jsonb_build_object('owner', cur.owner, 'group', cur.lease_group, 'session', cur.session_id,
                               'acquired_at', cur.acquired_at,
                               'expires_at', pgbaton.lease_expiry(cur.expires_at, cur.session_id)));
    PERFORM pg_notify('pgbaton_lease', p_name);
    RETURN NEXT;
END $$;

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
    GRANT UPDATE ON pgbaton.lease_session TO pgbaton_admin;
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

DROP FUNCTION pgbaton.next_token();
DROP FUNCTION pgbaton.insert_timeline();
DROP TABLE pgbaton.token_epoch;
