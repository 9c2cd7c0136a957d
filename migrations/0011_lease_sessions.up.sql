-- Lease sessions: one keep-alive for all the leases of a client.
--
-- Renewing every lease on its own costs a statement and a commit per lease
-- per renew interval: a client holding 10,000 leases at TTL 3s needs more
-- commits than a small server can do, and loses them all. A session is one
-- row a client keeps alive (pgbaton.session_keepalive, one HOT-free update
-- per interval whatever it holds); a lease bound to a session
-- (lease.session_id) is valid while its own grant has not expired OR its
-- session is alive:
--
--     valid  <=>  owner IS NOT NULL AND token matches AND
--                 greatest(lease.expires_at, session.expires_at) > clock_timestamp()
--
-- (pgbaton.lease_expiry computes the right-hand side; pgbaton.lease_status
-- shows it.) A session is never revived: a keep-alive of a session that has
-- expired fails, so a client paused past its TTL cannot bring back leases
-- others may have taken. Leases without a session (psql and other clients
-- of the SQL protocol: try_acquire + renew) work as before.

CREATE TABLE pgbaton.lease_session (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner      text NOT NULL CHECK (owner <> '' AND octet_length(owner) <= 255),
    ttl_ms     bigint NOT NULL CHECK (ttl_ms > 0),
    started_at timestamptz NOT NULL,
    renewed_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    -- Bumped when an operator force-releases a lease of this session: the
    -- keep-alive returns it, and the client looks for what it lost.
    revoked    bigint NOT NULL DEFAULT 0
);
-- Claim looks up dead sessions by expiry. One row per client: the index
-- makes its keep-alive a non-HOT update, which costs nothing at that rate.
CREATE INDEX lease_session_expires_idx ON pgbaton.lease_session (expires_at);

COMMENT ON TABLE pgbaton.lease_session IS
    'pgbaton: lease sessions; a lease with session_id is valid while its own grant or its session has not expired';

ALTER TABLE pgbaton.lease ADD COLUMN session_id bigint;
COMMENT ON COLUMN pgbaton.lease.session_id IS
    'pgbaton.lease_session keeping this lease alive beyond expires_at; NULL for leases renewed one by one';
-- The client's id for the request that made the grant: a request sent
-- again after its reply was lost (a broken connection, a failover) finds
-- its own grant instead of being refused by it, and a grant whose caller
-- gave up can be found and given back without knowing its token.
ALTER TABLE pgbaton.lease ADD COLUMN grant_ref uuid;

-- Held rows by group, then session, then age: claim finds the expired rows
-- of a dead session in order, semaphores count and wait on a group.
DROP INDEX pgbaton.lease_held_idx;
CREATE INDEX lease_held_idx ON pgbaton.lease (lease_group, session_id, seq)
    WHERE lease_group IS NOT NULL AND owner IS NOT NULL;
-- The leases of a session, to unbind them when it is closed or pruned.
CREATE INDEX lease_session_idx ON pgbaton.lease (session_id) WHERE session_id IS NOT NULL;

-- lease_expiry is when a lease with expiry p_expires_at bound to session
-- p_session expires: the later of its own expiry and its session's.
CREATE FUNCTION pgbaton.lease_expiry(p_expires_at timestamptz, p_session bigint)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_session IS NULL THEN p_expires_at
                ELSE greatest(p_expires_at, (SELECT s.expires_at FROM pgbaton.lease_session s WHERE s.id = p_session))
           END
$$;

-- lease_status is pgbaton.lease with the expiry and renewal of a session's
-- leases taken from their session, and whether each lease is held now:
-- read leases through it.
CREATE VIEW pgbaton.lease_status AS
SELECT l.name, l.lease_group, l.owner, l.token, l.acquired_at,
       CASE WHEN s.id IS NULL THEN l.renewed_at ELSE greatest(l.renewed_at, s.renewed_at) END AS renewed_at,
       CASE WHEN s.id IS NULL THEN l.expires_at ELSE greatest(l.expires_at, s.expires_at) END AS expires_at,
       l.metadata, l.session_id, l.seq,
       (l.owner IS NOT NULL AND
        CASE WHEN s.id IS NULL THEN l.expires_at ELSE greatest(l.expires_at, s.expires_at) END > clock_timestamp()) AS held
  FROM pgbaton.lease l
  LEFT JOIN pgbaton.lease_session s ON s.id = l.session_id;

COMMENT ON VIEW pgbaton.lease_status IS
    'pgbaton leases with their effective expiry (session keep-alive included) and whether they are held now';

-- session_of is the session a grant to p_owner binds to: p_session if it
-- is a session of p_owner, NULL if there is no such session (closed or
-- pruned meanwhile: the grant then lives by its own expiry), and an
-- invalid_parameter_value error if it is somebody else's: a lease must
-- never be kept alive by another owner's keep-alive.
CREATE FUNCTION pgbaton.session_of(p_session bigint, p_owner text)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    o text;
BEGIN
    IF p_session IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT s.owner INTO o FROM pgbaton.lease_session s WHERE s.id = p_session;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF o <> p_owner THEN
        RAISE EXCEPTION 'pgbaton: lease session % belongs to %, not %', p_session, o, p_owner
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN p_session;
END $$;

-- session_open starts a session for p_owner lasting p_ttl_ms unless kept
-- alive. It also prunes a few sessions dead for a while (see
-- prune_sessions), so crashed clients' sessions do not pile up.
CREATE FUNCTION pgbaton.session_open(p_owner text, p_ttl_ms bigint, OUT id bigint, OUT expires_at timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    t timestamptz := clock_timestamp();
BEGIN
    PERFORM pgbaton.lease_check_args('session', p_owner, p_ttl_ms);
    PERFORM pgbaton.prune_sessions(interval '1 minute', 10);
    INSERT INTO pgbaton.lease_session AS s (owner, ttl_ms, started_at, renewed_at, expires_at)
    VALUES (p_owner, p_ttl_ms, t, t, t + p_ttl_ms * interval '1 millisecond')
    RETURNING s.id, s.expires_at INTO id, expires_at;
END $$;

-- session_keepalive extends session p_id to p_ttl_ms from now and returns
-- the new expiry and the session's revoked counter; no row when the
-- session has expired or does not exist: it is never revived.
CREATE FUNCTION pgbaton.session_keepalive(p_id bigint, p_ttl_ms bigint)
RETURNS TABLE (expires_at timestamptz, revoked bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    t timestamptz := clock_timestamp();
BEGIN
    IF p_ttl_ms IS NULL OR p_ttl_ms <= 0 THEN
        RAISE EXCEPTION 'pgbaton: session ttl_ms must be positive, got %', p_ttl_ms USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    UPDATE pgbaton.lease_session s
       SET renewed_at = t, expires_at = t + p_ttl_ms * interval '1 millisecond'
     WHERE s.id = p_id AND s.expires_at > t
    RETURNING s.expires_at, s.revoked;
END $$;

-- session_close ends session p_id: its leases keep only their own expiry
-- (those the client released are no longer bound to it), and the row goes.
CREATE FUNCTION pgbaton.session_close(p_id bigint)
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
    UPDATE pgbaton.lease l SET session_id = NULL WHERE l.session_id = p_id;
    DELETE FROM pgbaton.lease_session s WHERE s.id = p_id;
END $$;

-- prune_sessions deletes up to p_limit sessions expired more than p_after
-- ago (longer than any TTL, so no lease of theirs is still valid by its
-- own expiry) and unbinds their leases, which stay claimable as expired
-- leases. It returns how many it deleted. Sessions another call is pruning
-- are skipped.
CREATE FUNCTION pgbaton.prune_sessions(p_after interval, p_limit integer)
RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    dead bigint[];
BEGIN
    dead := ARRAY(
        SELECT s.id FROM pgbaton.lease_session s
         WHERE s.expires_at < clock_timestamp() - p_after
         ORDER BY s.expires_at LIMIT p_limit FOR UPDATE SKIP LOCKED);
    IF cardinality(dead) = 0 THEN
        RETURN 0;
    END IF;
    UPDATE pgbaton.lease l SET session_id = NULL WHERE l.session_id = ANY (dead);
    DELETE FROM pgbaton.lease_session s WHERE s.id = ANY (dead);
    RETURN cardinality(dead);
END $$;

-- session_lost returns which of the grants (p_names, p_tokens) of p_owner
-- in session p_session are no longer held by it: force-released by an
-- operator (the session's revoked counter moved) or gone.
CREATE FUNCTION pgbaton.session_lost(p_session bigint, p_names text[], p_tokens bigint[], p_owner text)
RETURNS SETOF text
LANGUAGE sql STABLE
SET enable_seqscan = off
AS $$
    SELECT g.name FROM unnest(p_names, p_tokens) AS g(name, token)
     WHERE NOT EXISTS (
        SELECT 1 FROM pgbaton.lease l
         WHERE l.name = g.name AND l.token = g.token AND l.owner = p_owner AND l.session_id = p_session)
$$;

-- release_ref gives back the leases of p_owner in session p_session that
-- the request p_ref granted: a request whose caller gave up, or whose
-- reply was lost, may have been granted without the client knowing the
-- tokens. Returns the names released.
CREATE FUNCTION pgbaton.release_ref(p_owner text, p_session bigint, p_ref uuid)
RETURNS SETOF text
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    names  text[];
    tokens bigint[];
BEGIN
    SELECT array_agg(l.name), array_agg(l.token) INTO names, tokens FROM pgbaton.lease l
     WHERE l.session_id = p_session AND l.grant_ref = p_ref AND l.owner = p_owner;
    IF names IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT pgbaton.release_many(names, tokens, p_owner);
END $$;

-- settle_many settles leases of p_owner completed in a transaction
-- (complete_tx) once that transaction has ended: for each name it returns
-- 'gone' (the completion committed, or the lease moved on), 'released'
-- (the transaction rolled back: the lease is released now, so the item is
-- claimable at once rather than when its session ends) or 'busy' (its row
-- is still locked: the transaction is still open; ask again later).
CREATE FUNCTION pgbaton.settle_many(p_names text[], p_tokens bigint[], p_owner text)
RETURNS TABLE (name text, state text)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    present  text[];
    unlocked text[];
    freed    text[];
BEGIN
    present := ARRAY(
        SELECT l.name FROM pgbaton.lease l
         WHERE l.name = ANY (p_names) AND l.token = ANY (p_tokens) AND l.owner = p_owner);
    unlocked := ARRAY(
        SELECT l.name FROM pgbaton.lease l
         WHERE l.name = ANY (present) AND l.token = ANY (p_tokens) AND l.owner = p_owner
           FOR UPDATE SKIP LOCKED);
    freed := ARRAY(SELECT pgbaton.release_many(unlocked, p_tokens, p_owner));
    RETURN QUERY
    SELECT n, CASE WHEN n = ANY (freed) THEN 'released' WHEN n = ANY (present) THEN 'busy' ELSE 'gone' END
      FROM unnest(p_names) n;
END $$;

-- lease_attempt as in migration 0003, binding a grant to p_session and
-- counting a lease held while its session is alive.
DROP FUNCTION pgbaton.try_acquire(text, text, bigint);
DROP FUNCTION pgbaton.lease_attempt(text, text, bigint, jsonb);
CREATE FUNCTION pgbaton.lease_attempt(p_name text, p_owner text, p_ttl_ms bigint, p_metadata jsonb DEFAULT NULL,
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

CREATE FUNCTION pgbaton.try_acquire(p_name text, p_owner text, p_ttl_ms bigint)
RETURNS TABLE (token bigint, expires_at timestamptz)
LANGUAGE sql AS $$
    SELECT a.token, a.expires_at FROM pgbaton.lease_attempt(p_name, p_owner, p_ttl_ms) a WHERE a.acquired
$$;

-- renew extends the lease (name, owner, token) to ttl_ms from now and
-- returns its expiry; no row when that grant is no longer valid. It never
-- inserts a row and never takes over an expired or stolen lease.
CREATE OR REPLACE FUNCTION pgbaton.renew(p_name text, p_owner text, p_token bigint, p_ttl_ms bigint)
RETURNS TABLE (expires_at timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    t timestamptz;
BEGIN
    PERFORM pgbaton.lease_check_args(p_name, p_owner, p_ttl_ms);
    t := clock_timestamp();
    RETURN QUERY
    UPDATE pgbaton.lease l
       SET renewed_at = t, expires_at = t + p_ttl_ms * interval '1 millisecond'
     WHERE l.name = p_name AND l.owner = p_owner AND l.token = p_token
       AND pgbaton.lease_expiry(l.expires_at, l.session_id) > t
    RETURNING pgbaton.lease_expiry(l.expires_at, l.session_id);
END $$;

-- release and release_many also unbind the lease from its session.
CREATE OR REPLACE FUNCTION pgbaton.release(p_name text, p_owner text, p_token bigint)
RETURNS boolean
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    g text;
BEGIN
    PERFORM pgbaton.lease_check_args(p_name, p_owner, 1);
    UPDATE pgbaton.lease l
       SET owner = NULL, expires_at = NULL, session_id = NULL
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
           SET owner = NULL, expires_at = NULL, session_id = NULL
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

-- claim as in migration 0007, binding grants to p_session; expired rows
-- are those whose own expiry and session (if any) have both passed.
DROP FUNCTION pgbaton.claim(text, text, integer, bigint);
CREATE FUNCTION pgbaton.claim(p_group text, p_owner text, p_n integer, p_ttl_ms bigint, p_session bigint DEFAULT NULL,
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

-- assert_token as in migration 0004, counting a lease held while its
-- session is alive.
CREATE OR REPLACE FUNCTION pgbaton.assert_token(p_name text, p_token bigint)
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
    SELECT l.token, l.owner, pgbaton.lease_expiry(l.expires_at, l.session_id) INTO l_token, l_owner, l_expires
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

-- force_release_lease as in migration 0005, counting session keep-alives,
-- unbinding the lease and telling its session's client (revoked).
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

-- grant_roles as in migration 0005, plus what force release now writes.
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

SELECT pgbaton.grant_roles();
