-- Fencing tokens that never go backwards, whatever a failover lost.
--
-- A token used to be nextval('pgbaton.lease_token_seq'). Promote an
-- asynchronous standby that lacks the last grants and its copy of the
-- sequence is behind: it hands out again tokens the old primary had
-- granted, and a stale holder of one of them would win over the holders of
-- the reissued ones (measured: the first token on the new primary was 34
-- after tokens up to 521). The same happens after a crash when grants were
-- committed with synchronous_commit = off.
--
-- A token is now epoch * 2^40 + nextval('pgbaton.lease_token_seq'), drawn
-- by pgbaton.next_token(). The epoch grows on the first token drawn on a
-- timeline other than the one it was last set on: after every promotion
-- (failover, switchover, Patroni restarting a crashed primary), every
-- point-in-time recovery, and after pg_upgrade or a restore into a new
-- cluster (whose timeline starts again at 1). It grows by the distance
-- between the two timelines, at least 1, so that a server promoted from a
-- history that already went through lost promotions still lands above
-- them (PostgreSQL numbers each new timeline above every timeline the
-- promoted server knows). So every token drawn after a timeline change is
-- larger than every token drawn before it on an earlier timeline, however
-- many grants replication lost, while the sequence stays below 2^40 (1.1
-- trillion grants) and the epoch below 2^23; next_token raises an error
-- rather than break that. On a database that never changed timeline since
-- this migration, tokens are what they were (epoch 0). fencedwrite still
-- compares tokens as plain bigints.
--
-- Not covered: two standbys promoted one after the other where the second
-- never saw the first's timeline (both pick the same timeline number; keep
-- a WAL archive, which makes PostgreSQL skip numbers already used), and
-- copies that do not carry the sequence (logical replication).

CREATE TABLE pgbaton.token_epoch (
    one      boolean PRIMARY KEY DEFAULT true CHECK (one),
    -- The timeline the epoch was last set on; NULL when the server does
    -- not tell (see insert_timeline).
    timeline bigint CHECK (timeline > 0),
    epoch    bigint NOT NULL CHECK (epoch >= 0 AND epoch < 8388608)
);

COMMENT ON TABLE pgbaton.token_epoch IS
    'pgbaton: the fencing token epoch (high bits of every token), raised on the first token drawn on a new timeline';

-- insert_timeline is the timeline this server writes WAL on: the first 8
-- hex digits of the current WAL file name. (pg_control_checkpoint()'s
-- timeline is the last checkpoint's: right after a promotion it is still
-- the old one until the first checkpoint completes.)
--
-- NULL when the server does not let us read its WAL position: Aurora
-- PostgreSQL refuses pg_current_wal_lsn() unless wal_level is logical. Its
-- failovers lose no acknowledged commit (the storage is shared), so the
-- epoch has nothing to guard against there. Whether the functions work is
-- found out once per session (a subtransaction) and remembered in the
-- session setting pgbaton.timeline_readable; a failed transaction forgets
-- it again.
CREATE FUNCTION pgbaton.insert_timeline()
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    readable text := current_setting('pgbaton.timeline_readable', true);
    tl bigint;
BEGIN
    IF readable = 'on' THEN
        RETURN ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
    ELSIF readable = 'off' THEN
        RETURN NULL;
    END IF;
    BEGIN
        tl := ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
        PERFORM set_config('pgbaton.timeline_readable', 'on', false);
    EXCEPTION WHEN OTHERS THEN
        PERFORM set_config('pgbaton.timeline_readable', 'off', false);
    END;
    RETURN tl;
END $$;

INSERT INTO pgbaton.token_epoch (timeline, epoch) VALUES (pgbaton.insert_timeline(), 0);

-- next_token draws a new fencing token. Call it only while holding the row
-- lock of the lease that gets the token, like nextval before it.
--
-- The epoch row is read on every call and locked only on the first call on
-- a new timeline, which raises it in the caller's transaction: until that
-- transaction ends, other grants wait for it. A server that does not tell
-- its timeline keeps the epoch as it is.
--
-- A grant must not be acknowledged before it is durable, or a crash would
-- let the sequence hand its token out again: with synchronous_commit = off
-- the caller's transaction commits with 'local' instead (flushed locally;
-- settings that wait for standbys are left as they are).
CREATE FUNCTION pgbaton.next_token()
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    tl  bigint := pgbaton.insert_timeline();
    e   pgbaton.token_epoch%ROWTYPE;
    seq bigint;
BEGIN
    SELECT * INTO e FROM pgbaton.token_epoch;
    IF NOT FOUND OR (tl IS NOT NULL AND e.timeline IS DISTINCT FROM tl) THEN
        SELECT * INTO e FROM pgbaton.token_epoch FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'pgbaton: pgbaton.token_epoch has no row; tokens cannot be drawn safely'
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        IF tl IS NOT NULL AND e.timeline IS DISTINCT FROM tl THEN
            UPDATE pgbaton.token_epoch t
               SET timeline = tl, epoch = t.epoch + greatest(1, coalesce(tl - t.timeline, 1))
            RETURNING * INTO e;
        END IF;
    END IF;
    seq := nextval('pgbaton.lease_token_seq');
    IF seq >= 1099511627776 THEN
        RAISE EXCEPTION 'pgbaton: fencing token sequence exhausted (2^40 grants)'
            USING ERRCODE = 'sequence_generator_limit_exceeded';
    END IF;
    IF current_setting('synchronous_commit') = 'off' THEN
        PERFORM set_config('synchronous_commit', 'local', true);
    END IF;
    RETURN e.epoch * 1099511627776 + seq;
END $$;

COMMENT ON FUNCTION pgbaton.next_token() IS
    'pgbaton: a new fencing token, larger than every token drawn before it, also across failovers (epoch * 2^40 + sequence)';

-- Every function that grants a token draws it with next_token; they are
-- otherwise as migration 0011 left them.

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
       SET owner = p_owner, token = pgbaton.next_token(), session_id = sid, grant_ref = p_ref,
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
           SET owner = p_owner, token = pgbaton.next_token(), session_id = sid, grant_ref = p_ref,
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
       SET owner = NULL, expires_at = NULL, session_id = NULL, token = pgbaton.next_token()
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

-- grant_roles as in 0011, and pgbaton_admin may raise the epoch
-- (force_release_lease draws a token).
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
    GRANT UPDATE ON pgbaton.token_epoch TO pgbaton_admin;
    BEGIN
        GRANT pgbaton_reader TO pgbaton_admin;
        GRANT pg_read_all_stats TO pgbaton_reader;
        GRANT pg_signal_backend TO pgbaton_admin;
    EXCEPTION WHEN insufficient_privilege OR invalid_grant_operation THEN
        RAISE NOTICE 'pgbaton: could not grant role memberships (%); a DBA should run SELECT pgbaton.grant_roles()', SQLERRM;
    END;
END $$;

SELECT pgbaton.grant_roles();
