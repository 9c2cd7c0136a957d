-- Leases: rows with an expiry by the database clock and a fencing token that
-- grows with every grant. Logged on purpose: an UNLOGGED table's sequence
-- would reset after a crash and tokens would go back (DESIGN rule 5).
CREATE SEQUENCE pgbaton.lease_token_seq AS bigint;

CREATE TABLE pgbaton.lease (
    name        text PRIMARY KEY CHECK (name <> '' AND octet_length(name) <= 255),
    -- "group" is reserved; NULL for standalone leases.
    lease_group text CHECK (lease_group <> '' AND octet_length(lease_group) <= 255),
    -- NULL when free.
    owner       text CHECK (owner <> '' AND octet_length(owner) <= 255),
    -- Last token granted for this name; kept after release and expiry so it
    -- only grows. NULL until the first grant.
    token       bigint,
    acquired_at timestamptz,
    renewed_at  timestamptz,
    -- NULL when free.
    expires_at  timestamptz,
    metadata    jsonb NOT NULL DEFAULT '{}',
    CONSTRAINT lease_held_has_expiry CHECK ((owner IS NULL) = (expires_at IS NULL))
);

ALTER SEQUENCE pgbaton.lease_token_seq OWNED BY pgbaton.lease.token;

COMMENT ON TABLE pgbaton.lease IS
    'pgbaton leases. (name, token) is valid iff owner IS NOT NULL AND token matches AND expires_at > clock_timestamp().';

-- Claiming scans only rows that can be granted. Free rows have their own
-- partial index, so rows finished or held by others never slow a claim down
-- (a plain (group, state) index decays as they pile up). Neither index
-- mentions expires_at, so renewals stay HOT updates.
CREATE INDEX lease_free_idx ON pgbaton.lease (lease_group, name)
    WHERE lease_group IS NOT NULL AND owner IS NULL;
CREATE INDEX lease_held_idx ON pgbaton.lease (lease_group)
    WHERE lease_group IS NOT NULL AND owner IS NOT NULL;

-- Every protocol function below takes the time from clock_timestamp(), not
-- now(): called inside a caller's long transaction, now() would be the
-- transaction's start and an expired lease would look alive.

CREATE FUNCTION pgbaton.lease_check_args(p_name text, p_owner text, p_ttl_ms bigint)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_name IS NULL OR p_name = '' OR octet_length(p_name) > 255 THEN
        RAISE EXCEPTION 'pgbaton: lease name must be 1 to 255 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_owner IS NULL OR p_owner = '' OR octet_length(p_owner) > 255 THEN
        RAISE EXCEPTION 'pgbaton: lease owner must be 1 to 255 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_ttl_ms IS NULL OR p_ttl_ms <= 0 THEN
        RAISE EXCEPTION 'pgbaton: lease ttl_ms must be positive, got %', p_ttl_ms USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- lease_attempt tries to take the lease name for owner for ttl_ms. When it
-- is granted, acquired is true and token/expires_at are the new grant's.
-- When someone holds it, acquired is false and token/expires_at/holder
-- describe the current holder, so a waiter knows when to look again; db_now
-- is the database clock at that moment. metadata, when not NULL, replaces
-- the row's metadata on a grant.
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

-- try_acquire takes the lease name for owner for ttl_ms: one row (token,
-- expires_at) when granted, no row when someone else holds it.
CREATE FUNCTION pgbaton.try_acquire(p_name text, p_owner text, p_ttl_ms bigint)
RETURNS TABLE (token bigint, expires_at timestamptz)
LANGUAGE sql AS $$
    SELECT a.token, a.expires_at FROM pgbaton.lease_attempt(p_name, p_owner, p_ttl_ms) a WHERE a.acquired
$$;

-- renew extends the lease (name, owner, token) to ttl_ms from now and
-- returns the new expiry; no row when that grant is no longer valid. It
-- never inserts a row and never takes over an expired or stolen lease.
CREATE FUNCTION pgbaton.renew(p_name text, p_owner text, p_token bigint, p_ttl_ms bigint)
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

-- Waiters register here before they wait, so release notifies only when
-- somebody waits: a NOTIFY serialises committing transactions on a
-- cluster-wide lock, which would cap releases at one commit flush at a
-- time. Unlogged: registrations need no WAL and mean nothing after a crash
-- (waiters look again when their LISTEN connection comes back). waiter is
-- unique per waiting call; name is a lease name, or a group name for
-- waiters on any lease of the group (semaphores).
CREATE UNLOGGED TABLE pgbaton.lease_waiter (
    name   text NOT NULL,
    waiter text NOT NULL,
    since  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (name, waiter)
);

-- wait_for registers waiter as waiting for lease name (or for any lease of
-- group name when p_group). Call it in its own transaction, after LISTEN
-- pgbaton_lease and before looking at the lease again. The FOR SHARE lock
-- orders it against releases: a release already running commits first
-- (and the next look sees the lease free), a later one sees this
-- registration and notifies.
CREATE FUNCTION pgbaton.wait_for(p_name text, p_waiter text, p_group boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbaton.lease_check_args(p_name, p_waiter, 1);
    INSERT INTO pgbaton.lease_waiter (name, waiter) VALUES (p_name, p_waiter) ON CONFLICT DO NOTHING;
    IF p_group THEN
        PERFORM 1 FROM pgbaton.lease l WHERE l.lease_group = p_name FOR SHARE;
    ELSE
        PERFORM 1 FROM pgbaton.lease l WHERE l.name = p_name FOR SHARE;
    END IF;
END $$;

-- stop_waiting removes a registration made by wait_for.
CREATE FUNCTION pgbaton.stop_waiting(p_name text, p_waiter text)
RETURNS void
LANGUAGE sql AS $$
    DELETE FROM pgbaton.lease_waiter w WHERE w.name = p_name AND w.waiter = p_waiter
$$;

-- release frees the lease (name, owner, token). If anyone waits for it
-- (pgbaton.wait_for), it wakes them with a NOTIFY on channel pgbaton_lease,
-- payload: the name; waiters for its group get one with the group's name. It returns false and changes nothing when that grant
-- was superseded: somebody else's lease is never released. An expired
-- grant nobody took over is still freed (true): no one else held the name
-- in between.
CREATE FUNCTION pgbaton.release(p_name text, p_owner text, p_token bigint)
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

-- complete deletes the lease row (name, owner, token): a work item is done
-- and must not be claimed again. Guarded like release. Tokens stay
-- monotonic if the name is used again: they come from one sequence.
CREATE FUNCTION pgbaton.complete(p_name text, p_owner text, p_token bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbaton.lease_check_args(p_name, p_owner, 1);
    DELETE FROM pgbaton.lease l WHERE l.name = p_name AND l.owner = p_owner AND l.token = p_token;
    RETURN FOUND;
END $$;

-- register creates free lease rows in group for names (shards, work items,
-- semaphore slots) and returns how many were new. Existing rows of the same
-- group are left alone; a name that exists outside the group is an error.
CREATE FUNCTION pgbaton.register(p_group text, p_names text[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    bad text;
BEGIN
    IF p_group IS NULL OR p_group = '' OR octet_length(p_group) > 255 THEN
        RAISE EXCEPTION 'pgbaton: lease group must be 1 to 255 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_names IS NULL OR EXISTS (SELECT 1 FROM unnest(p_names) x WHERE x IS NULL OR x = '' OR octet_length(x) > 255) THEN
        RAISE EXCEPTION 'pgbaton: lease names must be 1 to 255 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pgbaton.lease (name, lease_group)
    SELECT DISTINCT x, p_group FROM unnest(p_names) x
    ON CONFLICT (name) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    SELECT l.name INTO bad FROM pgbaton.lease l
     WHERE l.name = ANY (p_names) AND l.lease_group IS DISTINCT FROM p_group LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'pgbaton: lease % exists outside group %', bad, p_group USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN n;
END $$;

-- claim grants owner up to n leases of group that are free (never held,
-- released) or expired, each with a new token, skipping rows other claims
-- have locked (FOR UPDATE SKIP LOCKED), so concurrent workers never wait on
-- or get the same row.
CREATE FUNCTION pgbaton.claim(p_group text, p_owner text, p_n integer, p_ttl_ms bigint)
RETURNS TABLE (name text, token bigint, expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    t      timestamptz;
    picked text[];
BEGIN
    PERFORM pgbaton.lease_check_args(p_group, p_owner, p_ttl_ms);
    IF p_n IS NULL OR p_n <= 0 THEN
        RAISE EXCEPTION 'pgbaton: claim n must be positive, got %', p_n USING ERRCODE = 'invalid_parameter_value';
    END IF;
    t := clock_timestamp();
    picked := ARRAY(
        SELECT l.name FROM pgbaton.lease l
         WHERE l.lease_group = p_group AND l.owner IS NULL
         LIMIT p_n FOR UPDATE SKIP LOCKED);
    IF cardinality(picked) < p_n THEN
        picked := picked || ARRAY(
            SELECT l.name FROM pgbaton.lease l
             WHERE l.lease_group = p_group AND l.owner IS NOT NULL AND l.expires_at <= t
             LIMIT p_n - cardinality(picked) FOR UPDATE SKIP LOCKED);
    END IF;
    IF cardinality(picked) = 0 THEN
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
        RETURNING l.name, l.token, l.expires_at)
    SELECT g.name, g.token, g.expires_at FROM granted g ORDER BY g.name;
END $$;

-- Job runs: one row per run of a job under its lease, so a later holder can
-- see what happened and resume from the last checkpoint.
CREATE TABLE pgbaton.job_run (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job          text NOT NULL CHECK (job <> '' AND octet_length(job) <= 255),
    owner        text NOT NULL,
    -- The lease token the run was started under; checkpoints are fenced by it.
    token        bigint NOT NULL,
    status       text NOT NULL DEFAULT 'started'
                 CHECK (status IN ('started', 'succeeded', 'failed', 'cancelled', 'lost')),
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at  timestamptz,
    heartbeat_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    error        text,
    checkpoint   jsonb,
    CHECK ((status = 'started') = (finished_at IS NULL))
);
CREATE INDEX job_run_job_idx ON pgbaton.job_run (job, id DESC);

-- Cron slots: a scheduled run of a job is claimed once per (job,
-- scheduled_at), whichever node's ticker fires first.
CREATE TABLE pgbaton.cron_slot (
    job          text NOT NULL CHECK (job <> '' AND octet_length(job) <= 255),
    scheduled_at timestamptz NOT NULL,
    owner        text NOT NULL,
    claimed_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job, scheduled_at)
);
