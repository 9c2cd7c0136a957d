-- Leases: rows with an expiry by the database clock and a fencing token that
-- grows with every grant. Logged on purpose: an UNLOGGED table's sequence
-- would reset after a crash and tokens would go back (DESIGN rule 5).
--
-- Every protocol function below takes the time from clock_timestamp(), not
-- now(): called inside a caller's long transaction, now() would be the
-- transaction's start and an expired lease would look alive.
--
-- Plans that stay on the indexes whatever the statistics say: pgbaton.lease
-- is a queue and a lock table at once: it can hold eight busy leases one
-- minute and a burst of a million work items the next. The planner sizes it
-- from statistics taken at the last VACUUM or ANALYZE, and plpgsql caches
-- the plans per connection. After a VACUUM of a table with a few live rows
-- on many pages, a burst of 10k items was planned as a table of 8 rows:
-- claim picked and granted rows with sequential scans, O(rows) per call,
-- 2-4x slower at 10k rows (bench/, "Work items" after the lease rows) and
-- worse the deeper the queue. Every lookup has an index that is right at
-- any size (primary key, lease_free_idx, lease_held_idx, lease_waiter's
-- key), so the functions that touch the lease tables SET enable_seqscan =
-- off: the setting holds for the duration of each call only.
--
-- Statements inside these functions keep their plans: a LANGUAGE sql
-- function Postgres cannot inline (a SET clause, SECURITY DEFINER, or a
-- body that is not a SELECT rules inlining out) is parsed and planned again
-- at every call before Postgres 18, so such functions are plpgsql, which
-- keeps its plans for the session. The functions whose statements join or
-- match array parameters (and claim, whose grant matches the names it
-- picked) SET plan_cache_mode = force_generic_plan: Postgres guesses an
-- array's size for the generic plan and then finds it costlier than a
-- custom plan for the one or two names of a typical call, so it planned
-- those statements again at every call (40-70 us each, with complete_many a
-- third of a one-item CompleteAndClaim). The generic plans are the index
-- plans the custom ones were. lease_attempt sets it too, for another
-- reason: planning opens every index of every table a statement reads,
-- and a grant bound to a session and a waiter, planned so at each of its
-- first five calls on a connection, locked 20 relations. Past the 16 a
-- backend locks on its fast path (before Postgres 18), locks go to the
-- shared lock table, where every backend granting the same lease table
-- queues on one partition lock (500 clients: up to 29 backends at once
-- waiting on LWLock LockManager). Its generic plans lock 13.
--
-- Batch functions over many leases join their (name, token) pairs with
-- unnest instead of testing token = ANY(tokens) per row: with arrays passed
-- as parameters that test is a linear search, so a batch of n leases cost
-- O(n^2) (20,000 leases: 1.3 s; a Close with 100,000 would have taken half
-- a minute). The pairs match exactly where the two sets would (every token
-- is granted to one row only).
CREATE SEQUENCE pgbaton.lease_token_seq AS bigint;

-- Claim hands out the oldest available item first, whether it was never
-- held, released or expired: items keep the place in the queue they got at
-- registration. Without that, an expired item (a crashed worker's) was
-- claimed only once every never-claimed item was gone. seq never changes
-- after the row is made, so renewals, which touch no indexed column, stay
-- HOT updates.
CREATE SEQUENCE pgbaton.lease_seq AS bigint;

-- Lease sessions: one keep-alive for all the leases of a client.
--
-- Renewing every lease on its own costs a statement and a commit per lease
-- per renew interval: a client holding 10,000 leases at TTL 3s needs more
-- commits than a small server can do, and loses them all. A session is one
-- row a client keeps alive (pgbaton.session_keepalive, one update per
-- interval whatever it holds, mostly HOT); a lease bound to a session
-- (lease.session_id) is valid while its own grant has not expired OR its
-- session is alive:
--
--     valid  <=>  owner IS NOT NULL AND token matches AND
--                 greatest(lease.expires_at, session.expires_at) > clock_timestamp()
--
-- (pgbaton.lease_expiry, the one place that says so, computes the
-- right-hand side; pgbaton.lease_status shows it.) A session is never
-- revived: a keep-alive of a session that has expired fails, so a client
-- paused past its TTL cannot bring back leases others may have taken.
-- Leases without a session (psql and other clients of the SQL protocol:
-- try_acquire + renew) are renewed one by one.
CREATE TABLE pgbaton.lease_session (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner      text NOT NULL CHECK (owner <> '' AND octet_length(owner) <= 255),
    ttl_ms     bigint NOT NULL CHECK (ttl_ms > 0),
    started_at timestamptz NOT NULL,
    renewed_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    -- A lower bound of expires_at, the one that claim and prune_sessions
    -- find ended sessions by (lease_session_floor_idx): a keep-alive moves
    -- it up to expires_at only once it is less than a quarter of the TTL
    -- ahead of the keep-alive. At the default pace one keep-alive in two
    -- (a client holding no lease: every 8.5s of a 15s TTL) or in three
    -- (holding leases: every TTL/3) changes an indexed column; the others
    -- are HOT updates, one WAL record and no index entry. Keep-alives
    -- more than three quarters of the TTL apart all move it.
    -- An index on expires_at itself took two entries per keep-alive, and
    -- a fleet's keep-alives queued on its rightmost page (LWLock
    -- BufferContent); reading every session instead cost each claim
    -- 40-60ns per open session. A session whose floor has passed may
    -- still live (its last keep-alive left the floor), and is then read
    -- and skipped: only one last kept alive more than a quarter TTL ago.
    -- The check keeps a hand-written UPDATE of expires_at from hiding an
    -- ended session; '-infinity', the default of a row inserted by hand,
    -- is read at every claim until its first keep-alive.
    expires_floor timestamptz NOT NULL DEFAULT '-infinity'
        CONSTRAINT lease_session_floor_check CHECK (expires_floor <= expires_at),
    -- Bumped when an operator force-releases a lease of this session: the
    -- keep-alive returns it, and the client looks for what it lost.
    revoked    bigint NOT NULL DEFAULT 0
)
-- Room on each page for a new version of every row, for the HOT updates.
WITH (fillfactor = 50);

CREATE INDEX lease_session_floor_idx ON pgbaton.lease_session (expires_floor);

COMMENT ON TABLE pgbaton.lease_session IS
    'pgbaton: lease sessions; a lease with session_id is valid while its own grant or its session has not expired';

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
    -- The place in the queue (lease_seq above).
    seq         bigint NOT NULL DEFAULT nextval('pgbaton.lease_seq'),
    session_id  bigint,
    -- The client's id for the request that made the grant: a request sent
    -- again after its reply was lost (a broken connection, a failover)
    -- finds its own grant instead of being refused by it, and a grant whose
    -- caller gave up can be found and given back without knowing its token.
    grant_ref   uuid,
    -- The grant's lock-delay (Chubby's lock-delay, Consul's LockDelay),
    -- chosen by its holder at grant time: when the grant is lost rather
    -- than released (it expires, or is force-released keeping the delay),
    -- the name is not granted again before lock_delay_ms after its expiry
    -- (lease_free_at). A release or completion frees it at once. Bounded
    -- by lock_delay_max_ms (60 s): longer would keep a name from everyone
    -- for longer than a person waits. 0 (the default) is no delay.
    lock_delay_ms bigint NOT NULL DEFAULT 0 CHECK (lock_delay_ms >= 0 AND lock_delay_ms <= 60000),
    CONSTRAINT lease_held_has_expiry CHECK ((owner IS NULL) = (expires_at IS NULL))
)
-- Renewals of leases renewed one by one (pgbaton.renew) touch no indexed
-- column; leave room on each page so they are HOT updates.
WITH (fillfactor = 90);

ALTER SEQUENCE pgbaton.lease_token_seq OWNED BY pgbaton.lease.token;
ALTER SEQUENCE pgbaton.lease_seq OWNED BY pgbaton.lease.seq;

COMMENT ON TABLE pgbaton.lease IS
    'pgbaton leases. (name, token) is valid iff token matches AND pgbaton.lease_expiry(expires_at, pgbaton.session_expiry(session_id)) > clock_timestamp().';
COMMENT ON COLUMN pgbaton.lease.session_id IS
    'pgbaton.lease_session keeping this lease alive beyond expires_at; NULL for leases renewed one by one';

-- Claiming scans only rows that can be granted. Free rows have their own
-- partial index, so rows finished or held by others never slow a claim down
-- (a plain (group, state) index decays as they pile up). Neither index
-- mentions expires_at, so renewals stay HOT updates.
CREATE INDEX lease_free_idx ON pgbaton.lease (lease_group, seq)
    WHERE lease_group IS NOT NULL AND owner IS NULL;
-- Held rows by group, then session, then age: claim finds the expired rows
-- of a dead session in order, semaphores count and wait on a group.
CREATE INDEX lease_held_idx ON pgbaton.lease (lease_group, session_id, seq)
    WHERE lease_group IS NOT NULL AND owner IS NOT NULL;

-- The leases of a session, to unbind them when it is closed or pruned.
CREATE INDEX lease_session_idx ON pgbaton.lease (session_id) WHERE session_id IS NOT NULL;
-- A request's grants by the request's id: release_ref and a claim sent
-- again find them without reading every other lease of the session (a
-- client may keep 100,000). grant_ref changes only with a grant, which
-- changes owner (indexed) anyway, so renewals stay HOT.
CREATE INDEX lease_grant_ref_idx ON pgbaton.lease (grant_ref) WHERE grant_ref IS NOT NULL;

-- Named leases by their last grant, for their retention. acquired_at
-- changes only with a grant, which changes owner (indexed) anyway, so
-- renewals stay HOT.
CREATE INDEX lease_named_idx ON pgbaton.lease (acquired_at) WHERE lease_group IS NULL;

-- The wait queue. A waiter registers here (wait_for) before it waits: its
-- place is seq, so a free lease goes to the oldest live waiter
-- (waiters_ahead), and a release wakes as many waiters as things became
-- free, oldest first (notify_waiters), not all of them. A waiter is live
-- while the session it registered with (session_id) lives, or, without
-- one, until expires_at (wait_for renews it): one that died leaves the
-- queue by itself. Unlogged: registrations need no WAL and mean nothing
-- after a crash (waiters register again when their LISTEN connection
-- comes back, or at their next look). waiter is unique per waiting call;
-- name is a lease name, or a group name (is_group) for waiters on any
-- lease of the group (semaphores, ClaimWait).
--
-- rank orders candidates of an election before their age: the queue is
-- served by rank, highest first, then by seq (waiters_ahead,
-- notify_waiters), so a preferred candidate (a newer version, the right
-- zone) gets the term when the current one ends. Every other waiter has
-- rank 0. A NULL rank is an observer: it waits for nothing and is never
-- served, and is notified instead when the lease is granted to a
-- candidate of an election or its leader is asked to resign
-- (notify_observers): leasetable's Observe, and each leader watching for
-- requests to resign.
CREATE SEQUENCE pgbaton.lease_waiter_seq AS bigint;

CREATE UNLOGGED TABLE pgbaton.lease_waiter (
    name       text NOT NULL,
    waiter     text NOT NULL,
    since      timestamptz NOT NULL DEFAULT clock_timestamp(),
    seq        bigint NOT NULL DEFAULT nextval('pgbaton.lease_waiter_seq'),
    is_group   boolean NOT NULL DEFAULT false,
    -- false for a waiter that polls: nobody would hear its NOTIFY, and a
    -- NOTIFY costs every commit of the database the notify lock.
    listens    boolean NOT NULL DEFAULT true,
    -- true for a waiter that stops when its group is drained
    -- (ClaimUntilDrained): completions in the group wake it (wake_drained).
    drain      boolean NOT NULL DEFAULT false,
    owner      text,
    session_id bigint,
    expires_at timestamptz,
    rank       integer DEFAULT 0,
    PRIMARY KEY (name, waiter)
);

ALTER SEQUENCE pgbaton.lease_waiter_seq OWNED BY pgbaton.lease_waiter.seq;

CREATE INDEX lease_waiter_since_idx ON pgbaton.lease_waiter (since);
-- The queue of a name, in the order it is served (observers last): the
-- head is the first entry, and the waiters ahead of one are a range.
CREATE INDEX lease_waiter_queue_idx ON pgbaton.lease_waiter (name, rank DESC NULLS LAST, seq);

-- lease_expiry is the one definition of whether a grant holds: the instant
-- a lease row stops being held, from its own expiry p_expires_at and the
-- expiry p_session_expires_at of the session it is bound to (NULL when
-- none): the later of the two, and NULL for a free row (no expiry: nobody
-- holds it). So
--
--     held  <=>  pgbaton.lease_expiry(l.expires_at, pgbaton.session_expiry(l.session_id)) > clock_timestamp()
--
-- and a name may be granted again lease_free_at (below: this plus the
-- grant's lock-delay) after that. Every function, view and query that
-- asks whether a lease is held, or until when, calls it; where the session's row is joined already (lease_status,
-- claim's dead sessions) it passes that row's expires_at instead of
-- looking it up again. A failover grace does not enter it: the grace holds
-- back new grants (grant_state), not the expiry of the ones made.
--
-- It must stay inlinable: LANGUAGE sql, one expression with no subquery,
-- no SET clause, not SECURITY DEFINER, not STRICT. The planner then puts
-- the expression itself where it is called, so the index conditions of
-- the statements around it (claim, group_free) stay as they were. That is
-- why it takes the session's expiry and not the session's id: looking the
-- session up takes a subquery, which would rule inlining out (Postgres
-- would then parse and plan the body again in every statement that calls
-- it) and, in the views, cost a lookup per row the join has already made.
CREATE FUNCTION pgbaton.lease_expiry(p_expires_at timestamptz, p_session_expires_at timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_expires_at IS NOT NULL THEN greatest(p_expires_at, p_session_expires_at) END
$$;

COMMENT ON FUNCTION pgbaton.lease_expiry(timestamptz, timestamptz) IS
    'pgbaton: when a lease stops being held: the later of its own expiry and its session''s, NULL when free; held iff this > clock_timestamp()';

-- lease_free_at is the one definition of when a name may be granted again:
-- lease_expiry, the instant its grant stops being held, plus the grant's
-- lock-delay p_lock_delay_ms; NULL for a free row (released, completed or
-- never granted: free now). So
--
--     grantable  <=>  pgbaton.lease_free_at(l.expires_at, <session expiry>, l.lock_delay_ms) IS NULL
--                     OR pgbaton.lease_free_at(...) <= clock_timestamp()
--
-- Every statement that grants (lease_attempt, claim) or counts what can be
-- granted (group_free) asks it; what asks whether a grant still holds
-- (renew, assert_token, lease_status.held) asks lease_expiry. Between the
-- two instants the grant is lost and the name is in lock-delay: a holder
-- that cannot be reached, or was paused, may still be finishing writes to
-- a resource that cannot check a fencing token, and nobody else is given
-- the name until they had lock_delay_ms to land. A clean release sets
-- owner and expires_at to NULL, so it frees the name at once whatever the
-- delay.
--
-- It is built on lease_expiry rather than next to it, and inlinable for
-- the same reasons (see lease_expiry). It is STABLE, not IMMUTABLE:
-- timestamptz + interval is STABLE (it reads TimeZone), and Postgres does
-- not inline an IMMUTABLE function whose body is less than immutable. As
-- IMMUTABLE it was planned again in every transaction that called it,
-- twice per grant: a try-acquire + release cycle made 953-1,471 cycles/s
-- against 1,298-1,774 as STABLE (pgbench, one client, fsync off, 4
-- alternating pairs; migrations' TestScalarSQLFunctionsInline).
CREATE FUNCTION pgbaton.lease_free_at(p_expires_at timestamptz, p_session_expires_at timestamptz, p_lock_delay_ms bigint)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT pgbaton.lease_expiry(p_expires_at, p_session_expires_at) + p_lock_delay_ms * interval '1 millisecond'
$$;

COMMENT ON FUNCTION pgbaton.lease_free_at(timestamptz, timestamptz, bigint) IS
    'pgbaton: when a name may be granted again: lease_expiry plus the grant''s lock-delay; NULL when free now';

-- lock_delay_max_ms is the longest lock-delay a grant may ask for: 60 s,
-- Consul's bound too (a constant function, put in place when planned).
CREATE FUNCTION pgbaton.lock_delay_max_ms()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 60000::bigint
$$;

-- session_expiry is when lease session p_session expires: NULL for no
-- session (STRICT: a lease without one costs no call), or for one that is
-- gone (closed or pruned, which unbound its leases). plpgsql, which keeps
-- its plan for the connection.
CREATE FUNCTION pgbaton.session_expiry(p_session bigint)
RETURNS timestamptz
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE AS $$
BEGIN
    RETURN (SELECT s.expires_at FROM pgbaton.lease_session s WHERE s.id = p_session);
END $$;

-- lease_status is pgbaton.lease with the expiry and renewal of a session's
-- leases taken from their session, whether each lease is held now, and,
-- for a lost grant whose lock-delay has not ended, when it ends
-- (lock_delay_until; NULL otherwise): read leases through it. (held tests
-- owner first so that it is false, not NULL, for a free lease.)
CREATE VIEW pgbaton.lease_status AS
SELECT l.name, l.lease_group, l.owner, l.token, l.acquired_at,
       CASE WHEN s.id IS NULL THEN l.renewed_at ELSE greatest(l.renewed_at, s.renewed_at) END AS renewed_at,
       pgbaton.lease_expiry(l.expires_at, s.expires_at) AS expires_at,
       l.metadata, l.session_id, l.seq,
       (l.owner IS NOT NULL AND pgbaton.lease_expiry(l.expires_at, s.expires_at) > clock_timestamp()) AS held,
       l.lock_delay_ms,
       CASE WHEN pgbaton.lease_expiry(l.expires_at, s.expires_at) <= clock_timestamp()
             AND pgbaton.lease_free_at(l.expires_at, s.expires_at, l.lock_delay_ms) > clock_timestamp()
            THEN pgbaton.lease_free_at(l.expires_at, s.expires_at, l.lock_delay_ms) END AS lock_delay_until
  FROM pgbaton.lease l
  LEFT JOIN pgbaton.lease_session s ON s.id = l.session_id;

COMMENT ON VIEW pgbaton.lease_status IS
    'pgbaton leases with their effective expiry (session keep-alive included), whether they are held now, and until when a lost grant''s lock-delay holds the name back';

-- waiter_alive is whether a registration in the wait queue (its session
-- p_session, or without one its own expiry p_expires_at) still waits: a
-- waiter whose process died leaves the queue when its session expires.
-- plpgsql, whose plans a session keeps: its lookup of the session and
-- clock_timestamp() keep Postgres from inlining it, and a LANGUAGE sql
-- function it does not inline is planned again in every statement that
-- calls it (every look counts the live waiters ahead of it).
CREATE FUNCTION pgbaton.waiter_alive(p_session bigint, p_expires_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    IF p_session IS NULL THEN
        RETURN coalesce(p_expires_at > clock_timestamp(), false);
    END IF;
    RETURN coalesce((SELECT s.expires_at > clock_timestamp() FROM pgbaton.lease_session s WHERE s.id = p_session), false);
END $$;

-- lease_queue is the wait queue as operators read it: the live waiters
-- of each lease or group, with their place (1 is next), their client (its
-- session's owner), how long they have waited, and their rank (0 but for
-- the preferred candidates of an election). Observers do not queue.
CREATE VIEW pgbaton.lease_queue AS
SELECT w.name, w.is_group,
       row_number() OVER (PARTITION BY w.name ORDER BY w.rank DESC, w.seq) AS position,
       w.waiter, coalesce(w.owner, s.owner, split_part(w.waiter, '/', 1)) AS owner, w.since,
       clock_timestamp() - w.since AS waited, w.rank
  FROM pgbaton.lease_waiter w
  LEFT JOIN pgbaton.lease_session s ON s.id = w.session_id
 WHERE w.rank IS NOT NULL AND pgbaton.waiter_alive(w.session_id, w.expires_at);

COMMENT ON VIEW pgbaton.lease_queue IS
    'pgbaton wait queue: live waiters of each lease or group in the order they are served';

-- Fencing tokens that never go backwards, whatever a failover lost.
--
-- A plain nextval('pgbaton.lease_token_seq') would not do. Promote an
-- asynchronous standby that lacks the last grants and its copy of the
-- sequence is behind: it hands out again tokens the old primary had
-- granted, and a stale holder of one of them would win over the holders of
-- the reissued ones (measured: the first token on the new primary was 34
-- after tokens up to 521). The same happens after a crash when grants were
-- committed with synchronous_commit = off.
--
-- So a token is epoch * 2^40 + nextval('pgbaton.lease_token_seq'), drawn
-- by pgbaton.next_token(). The epoch grows on a timeline other than the
-- one it was last set on (computed by every grant, stored by sync_epoch in
-- a statement of its own): after every promotion
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
-- rather than break that. On a database that never changed timeline the
-- epoch is 0. fencedwrite compares tokens as plain bigints.
--
-- Not covered: two standbys promoted one after the other where the second
-- never saw the first's timeline (both pick the same timeline number; keep
-- a WAL archive, which makes PostgreSQL skip numbers already used), and
-- copies that do not carry the sequence (logical replication).
--
-- The two bounds of that layout are named once here. token_seq_limit is
-- 2^40: the sequence's part of a token stays below it, and an epoch is
-- worth that much. token_epoch_limit is 2^23: the epoch stays below it,
-- so that a token stays below 2^63 and fits a bigint. Constant functions
-- in SQL: Postgres puts their value in place when it plans a call.
CREATE FUNCTION pgbaton.token_seq_limit()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 1099511627776::bigint
$$;

CREATE FUNCTION pgbaton.token_epoch_limit()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 8388608::bigint
$$;

CREATE TABLE pgbaton.token_epoch (
    one      boolean PRIMARY KEY DEFAULT true CHECK (one),
    -- The timeline the epoch was last set on; NULL when the server does
    -- not tell (see insert_timeline).
    timeline bigint CHECK (timeline > 0),
    epoch    bigint NOT NULL CHECK (epoch >= 0 AND epoch < pgbaton.token_epoch_limit()),
    -- The failover grace (below): whether it is on, and the last one a
    -- timeline change imposed: from which timeline (to timeline), when it
    -- started and until when no grant is made.
    grace            boolean NOT NULL DEFAULT true,
    grace_from       bigint,
    grace_started_at timestamptz,
    grace_until      timestamptz
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
-- it again. Only a refusal that lasts is remembered (the role may not read
-- the WAL position, the server does not support it); any other error, such
-- as "recovery is in progress" on a standby whose session outlives its
-- promotion, is raised: no token is drawn without knowing the timeline.
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
    EXCEPTION WHEN insufficient_privilege OR feature_not_supported OR undefined_function THEN
        PERFORM set_config('pgbaton.timeline_readable', 'off', false);
    END;
    RETURN tl;
END $$;

INSERT INTO pgbaton.token_epoch (timeline, epoch) VALUES (pgbaton.insert_timeline(), 0);

-- No two holders across a lossy failover: the failover grace.
--
-- A promoted asynchronous standby may lack grants the old primary
-- acknowledged (and keep-alives of sessions it did). Their holders keep
-- working until their local deadlines, at most the TTL after their last
-- acknowledged request, so at most the longest TTL in use after the old
-- primary's end; the new primary sees those leases free or expired.
-- (Measured before the grace: a new holder 1.9 s after the crash, the old
-- one told at 2.6 s.) So, like Chubby's master fail-over, a new timeline
-- grants nothing — no name, work item, semaphore slot or election, whether
-- or not the name was ever granted (the lost grant may be of any name) —
-- until the longest TTL in use has passed since the new timeline's epoch
-- was stored (sync_epoch, before any grant on it; a grant on a timeline
-- not stored yet is refused too). A refused grant is an ordinary "not
-- granted" whose expiry is the grace's end, so waiters wait through it.
-- Renewals, keep-alives, releases and an operator's forced release work
-- throughout. Every timeline change imposes it (a switchover loses
-- nothing, but cannot be told apart from a failover here); where a
-- failover loses no acknowledged commit (synchronous replication with
-- synchronous_commit on or remote_apply) an operator turns it off with
-- pgbaton.set_failover_grace.
--
-- The longest TTL in use is the largest TTL any grant, session_open or
-- keep-alive used (lease_ttl, noted in the same transaction, before the
-- grant is acknowledged); a grant with a lock-delay counts its TTL plus
-- the delay, which a lost grant holds its name back for too. It never falls by itself. Not covered: a TTL
-- larger than every one before whose first grant is itself lost in the
-- failover (pgbaton's clients note their TTL when they open their
-- session, before their first grant).
CREATE TABLE pgbaton.lease_ttl (
    -- Rows are only added, never updated: a grant that notes a new
    -- longest TTL inside a caller's open transaction makes no other grant
    -- wait for it (two may add the same value).
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ttl_ms   bigint NOT NULL CHECK (ttl_ms > 0),
    noted_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX lease_ttl_idx ON pgbaton.lease_ttl (ttl_ms);

COMMENT ON TABLE pgbaton.lease_ttl IS
    'pgbaton: TTLs in use, a row each time a longer one is first used; the longest is the failover grace';

-- ttl_in_use is the longest TTL in use, in milliseconds; 0 when nothing
-- was ever granted. plpgsql, so that every grant does not plan it again
-- (see the top of this file).
CREATE FUNCTION pgbaton.ttl_in_use()
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT coalesce(max(t.ttl_ms), 0) FROM pgbaton.lease_ttl t);
END $$;

-- note_ttl records p_ttl_ms as in use when it is longer than every TTL
-- noted before.
CREATE FUNCTION pgbaton.note_ttl(p_ttl_ms bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_ttl_ms > pgbaton.ttl_in_use() THEN
        INSERT INTO pgbaton.lease_ttl (ttl_ms) VALUES (p_ttl_ms);
    END IF;
END $$;

-- grant_state is the epoch of tokens drawn now (token_epoch_now) and
-- until when grants must wait for the failover grace (grace_until, NULL
-- when they may be made now), reading the timeline once. On a timeline
-- not stored yet the grace has not started: it lasts at least the longest
-- TTL in use from now.
CREATE FUNCTION pgbaton.grant_state(OUT epoch bigint, OUT grace_until timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    tl  bigint := pgbaton.insert_timeline();
    e   pgbaton.token_epoch%ROWTYPE;
    t   timestamptz := clock_timestamp();
    ttl bigint;
BEGIN
    -- By its primary key (one): the callers run with enable_seqscan = off,
    -- and a seq scan's disabled cost would send the query to JIT (130 ms).
    SELECT * INTO e FROM pgbaton.token_epoch t WHERE t.one;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgbaton: pgbaton.token_epoch has no row; tokens cannot be drawn safely'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF tl IS NULL OR e.timeline IS NOT DISTINCT FROM tl THEN
        epoch := e.epoch;
        IF e.grace AND e.grace_until > t THEN
            grace_until := e.grace_until;
        END IF;
        RETURN;
    END IF;
    epoch := e.epoch + greatest(1, coalesce(tl - e.timeline, 1));
    IF e.grace THEN
        ttl := pgbaton.ttl_in_use();
        IF ttl > 0 THEN
            grace_until := t + ttl * interval '1 millisecond';
        END IF;
    END IF;
END $$;

-- failover_grace shows the failover grace for pgbaton status, the admin
-- page and the metrics: whether it is on (enabled), whether it holds
-- grants back now (active, until grace_until), the timeline change that
-- imposed it (from_timeline to to_timeline, at started_at; on a timeline
-- not stored yet, started_at is NULL and grace_until is where it would
-- end if stored now), the longest TTL in use, and the database clock. On
-- a standby it shows what is stored.
CREATE FUNCTION pgbaton.failover_grace(OUT enabled boolean, OUT active boolean, OUT grace_until timestamptz,
    OUT started_at timestamptz, OUT from_timeline bigint, OUT to_timeline bigint, OUT ttl_in_use_ms bigint,
    OUT db_now timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    e  pgbaton.token_epoch%ROWTYPE;
    tl bigint;
    g  timestamptz;
BEGIN
    SELECT * INTO e FROM pgbaton.token_epoch t WHERE t.one;  -- by key: see grant_state
    db_now := clock_timestamp();
    enabled := coalesce(e.grace, true);
    ttl_in_use_ms := pgbaton.ttl_in_use();
    grace_until := e.grace_until; started_at := e.grace_started_at;
    from_timeline := e.grace_from; to_timeline := e.timeline;
    IF NOT pg_catalog.pg_is_in_recovery() THEN
        tl := pgbaton.insert_timeline();
        IF tl IS NOT NULL AND e.timeline IS DISTINCT FROM tl THEN
            -- Not stored yet: what sync_epoch would start now.
            from_timeline := e.timeline; to_timeline := tl; started_at := NULL;
            grace_until := db_now + ttl_in_use_ms * interval '1 millisecond';
        END IF;
        SELECT s.grace_until INTO g FROM pgbaton.grant_state() s;
        active := g IS NOT NULL;
    ELSE
        active := enabled AND coalesce(e.grace_until > db_now, false);
    END IF;
END $$;

-- token_epoch_now is the epoch of tokens drawn now: the stored one, or,
-- on a timeline the row was not synced on yet, the one sync_epoch stores
-- for it, computed from the same row and not written. So the first grant
-- on a new timeline takes no lock on the epoch row in its caller's
-- transaction (a caller of the SQL protocol that kept that transaction
-- open would stall every other grant), and every session on the timeline
-- computes the same epoch whether or not the row was synced yet. A server
-- that does not tell its timeline keeps the epoch as it is.
CREATE FUNCTION pgbaton.token_epoch_now()
RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT (pgbaton.grant_state()).epoch
$$;

-- sync_epoch stores the epoch of the current timeline (token_epoch_now)
-- and returns it; on a new timeline it also starts the failover grace. It
-- runs in a statement of its own, never inside a grant: session_open and
-- session_keepalive call it, so every client stores it within a
-- keep-alive of a promotion (and a client refused a grant because it was
-- not stored yet calls it). Storing matters for the next
-- timeline change, which builds on the stored row: a timeline that moved
-- backwards (a restore into a new cluster) still raises the epoch once per
-- change only if each change was stored.
CREATE FUNCTION pgbaton.sync_epoch()
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    tl bigint := pgbaton.insert_timeline();
    e  bigint;
BEGIN
    IF tl IS NOT NULL THEN
        -- Concurrent syncs: the second re-reads the updated row and skips it.
        UPDATE pgbaton.token_epoch t
           SET timeline = tl, epoch = t.epoch + greatest(1, coalesce(tl - t.timeline, 1)),
               grace_from = t.timeline, grace_started_at = clock_timestamp(),
               grace_until = clock_timestamp() + pgbaton.ttl_in_use() * interval '1 millisecond'
         WHERE t.one AND t.timeline IS DISTINCT FROM tl  -- by key, see grant_state
        RETURNING t.epoch INTO e;
        IF FOUND THEN
            RETURN e;
        END IF;
    END IF;
    RETURN pgbaton.token_epoch_now();
END $$;

-- token_base is epoch * 2^40 for the tokens a statement draws now (a claim
-- draws it once for all its rows), checked against the epoch's bound;
-- p_epoch is the epoch when the caller read it already (grant_state).
--
-- A grant must not be acknowledged before it is durable, or a crash would
-- let the sequence hand its token out again: with synchronous_commit = off
-- the caller's transaction commits with 'local' instead (flushed locally;
-- settings that wait for standbys are left as they are).
CREATE FUNCTION pgbaton.token_base(p_epoch bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    e bigint := coalesce(p_epoch, pgbaton.token_epoch_now());
BEGIN
    IF e >= pgbaton.token_epoch_limit() THEN
        RAISE EXCEPTION 'pgbaton: fencing token epoch exhausted (2^23 timeline changes)'
            USING ERRCODE = 'sequence_generator_limit_exceeded';
    END IF;
    IF current_setting('synchronous_commit') = 'off' THEN
        PERFORM set_config('synchronous_commit', 'local', true);
    END IF;
    RETURN e * pgbaton.token_seq_limit();
END $$;

-- token_draw draws the next token on p_base (token_base). Call it only
-- while holding the row lock of the lease that gets the token.
CREATE FUNCTION pgbaton.token_draw(p_base bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    seq bigint := nextval('pgbaton.lease_token_seq');
BEGIN
    IF seq >= pgbaton.token_seq_limit() THEN
        RAISE EXCEPTION 'pgbaton: fencing token sequence exhausted (2^40 grants)'
            USING ERRCODE = 'sequence_generator_limit_exceeded';
    END IF;
    RETURN p_base + seq;
END $$;

-- next_token draws one new fencing token. Call it only while holding the
-- row lock of the lease that gets the token.
CREATE FUNCTION pgbaton.next_token()
RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT pgbaton.token_draw(pgbaton.token_base())
$$;

COMMENT ON FUNCTION pgbaton.next_token() IS
    'pgbaton: a new fencing token, larger than every token drawn before it, also across failovers (epoch * 2^40 + sequence)';

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

-- session_lock_key is the second half of the advisory lock of session
-- p_session, (reserved_pair_hi() + 3, session_lock_key(id)): a grant that
-- binds to the session holds it shared until it commits (session_hold);
-- closing and pruning the session take it exclusive, so they wait for the
-- grants in flight and see them. hashint8 folds the bigint id into the
-- int4 half: two sessions that share a key only wait for each other's
-- grants now and then.
CREATE FUNCTION pgbaton.session_lock_key(p_session bigint)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashint8(p_session)
$$;

-- session_hold is called by a grant just before it binds to session
-- p_session (from session_of): it holds the session's advisory lock
-- (session_lock_key) shared until the granting transaction ends and
-- returns p_session, or NULL if the row is gone meanwhile. Pruning then
-- passes that session by, and closing waits for the grant and unbinds it.
-- Without the lock a grant still uncommitted while its session was pruned
-- or closed committed bound to a row that was gone, and claim never picked
-- that lease again. Not a row lock: the workers of one client share its
-- session, and row locks of two transactions on one row make a multixact
-- (one per claim of 4 workers), written to WAL and frozen by vacuum later.
-- Under READ COMMITTED the look after the lock sees a close that committed
-- while the grant waited for it; a snapshot older than the lock (REPEATABLE
-- READ or SERIALIZABLE) might not, so there the row is locked as well,
-- which fails with a serialization error if it was deleted since.
CREATE FUNCTION pgbaton.session_hold(p_session bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_session IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(pgbaton.reserved_pair_hi() + 3, pgbaton.session_lock_key(p_session));
    IF current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM 1 FROM pgbaton.lease_session s WHERE s.id = p_session;
    ELSE
        PERFORM 1 FROM pgbaton.lease_session s WHERE s.id = p_session FOR KEY SHARE;
    END IF;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN p_session;
END $$;

-- session_open starts a session for p_owner lasting p_ttl_ms unless kept
-- alive, and returns the token epoch. It also prunes a few sessions dead
-- for a while (see prune_sessions), so crashed clients' sessions do not
-- pile up.
CREATE FUNCTION pgbaton.session_open(p_owner text, p_ttl_ms bigint, OUT id bigint, OUT expires_at timestamptz,
    OUT epoch bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    t timestamptz := clock_timestamp();
BEGIN
    PERFORM pgbaton.lease_check_args('session', p_owner, p_ttl_ms);
    PERFORM pgbaton.note_ttl(p_ttl_ms);
    epoch := pgbaton.sync_epoch();
    PERFORM pgbaton.prune_sessions(interval '1 minute', 10);
    INSERT INTO pgbaton.lease_session AS s (owner, ttl_ms, started_at, renewed_at, expires_at, expires_floor)
    VALUES (p_owner, p_ttl_ms, t, t, t + p_ttl_ms * interval '1 millisecond', t + p_ttl_ms * interval '1 millisecond')
    RETURNING s.id, s.expires_at INTO id, expires_at;
END $$;

-- session_keepalive extends session p_id to p_ttl_ms from now and returns
-- the new expiry, the session's revoked counter and the token epoch; no
-- row when the session has expired or does not exist: it is never
-- revived. A client that sees the epoch move looks for grants of its
-- session that the timeline change lost (session_lost): the session may
-- have reached the new primary while a later grant bound to it did not.
CREATE FUNCTION pgbaton.session_keepalive(p_id bigint, p_ttl_ms bigint)
RETURNS TABLE (expires_at timestamptz, revoked bigint, epoch bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    t timestamptz := clock_timestamp();
    e bigint;
BEGIN
    IF p_ttl_ms IS NULL OR p_ttl_ms <= 0 THEN
        RAISE EXCEPTION 'pgbaton: session ttl_ms must be positive, got %', p_ttl_ms USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pgbaton.note_ttl(p_ttl_ms);
    e := pgbaton.sync_epoch();
    RETURN QUERY
    -- expires_floor stays (a HOT update) while it is more than a quarter
    -- TTL ahead, and never above expires_at.
    UPDATE pgbaton.lease_session s
       SET renewed_at = t, expires_at = t + p_ttl_ms * interval '1 millisecond',
           expires_floor = CASE WHEN s.expires_floor >= t + p_ttl_ms * interval '250 microseconds'
                                THEN least(s.expires_floor, t + p_ttl_ms * interval '1 millisecond')
                                ELSE t + p_ttl_ms * interval '1 millisecond' END
     WHERE s.id = p_id AND s.expires_at > t
    RETURNING s.expires_at, s.revoked, e;
END $$;

-- unbound_expiry is the expiry a lease row bound to session p_session
-- keeps when it is unbound from it (closed or pruned): its own, except
-- that a grant with a lock-delay keeps the later of its own and the
-- session's, so that unbinding it never brings the end of its delay
-- (lease_free_at) forward.
CREATE FUNCTION pgbaton.unbound_expiry(p_expires_at timestamptz, p_session bigint, p_lock_delay_ms bigint)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_lock_delay_ms > 0 THEN pgbaton.lease_expiry(p_expires_at, pgbaton.session_expiry(p_session))
                ELSE p_expires_at END
$$;

-- session_close ends session p_id: its leases keep only their own expiry
-- (those the client released are no longer bound to it; a grant with a
-- lock-delay keeps the session's, unbound_expiry), and the row goes.
CREATE FUNCTION pgbaton.session_close(p_id bigint)
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
    -- First wait for grants binding to it (session_hold), so that the
    -- unbinding below sees them.
    PERFORM pg_advisory_xact_lock(pgbaton.reserved_pair_hi() + 3, pgbaton.session_lock_key(p_id));
    PERFORM 1 FROM pgbaton.lease_session s WHERE s.id = p_id FOR UPDATE;
    UPDATE pgbaton.lease l SET session_id = NULL, expires_at = pgbaton.unbound_expiry(l.expires_at, p_id, l.lock_delay_ms)
     WHERE l.session_id = p_id;
    DELETE FROM pgbaton.lease_session s WHERE s.id = p_id;
END $$;

-- prune_sessions deletes up to p_limit sessions expired more than p_after
-- ago (longer than any TTL, so no lease of theirs is still valid by its
-- own expiry) and unbinds their leases, which stay claimable as expired
-- leases. It returns how many it deleted. Sessions another call is pruning,
-- or that a grant still in flight binds to (session_hold), are skipped.
CREATE FUNCTION pgbaton.prune_sessions(p_after interval, p_limit integer)
RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    dead   bigint[] := '{}';
    cutoff timestamptz := clock_timestamp() - p_after;
    d      bigint;
BEGIN
    -- One dead session at a time, its try-lock only once it is known
    -- dead: with both tests in one WHERE the planner tested the lock first,
    -- on every row, so a prune locked every live session until it
    -- committed and held up every grant binding to one (session_hold).
    -- The cutoff is a value, not clock_timestamp(), so that it bounds the
    -- index scan to the dead.
    FOR d IN SELECT s.id FROM pgbaton.lease_session s
              WHERE s.expires_floor < cutoff AND s.expires_at < cutoff ORDER BY s.expires_floor LOOP
        EXIT WHEN cardinality(dead) >= p_limit;
        IF pg_try_advisory_xact_lock(pgbaton.reserved_pair_hi() + 3, pgbaton.session_lock_key(d)) THEN
            PERFORM 1 FROM pgbaton.lease_session s WHERE s.id = d FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                dead := dead || d;
            END IF;
        END IF;
    END LOOP;
    IF cardinality(dead) = 0 THEN
        RETURN 0;
    END IF;
    UPDATE pgbaton.lease l SET session_id = NULL, expires_at = pgbaton.unbound_expiry(l.expires_at, l.session_id, l.lock_delay_ms)
     WHERE l.session_id = ANY (dead);
    DELETE FROM pgbaton.lease_session s WHERE s.id = ANY (dead);
    RETURN cardinality(dead);
END $$;

-- session_lost returns which of the grants (p_names, p_tokens) of p_owner
-- in session p_session are no longer held by it: force-released by an
-- operator (the session's revoked counter moved) or gone.
CREATE FUNCTION pgbaton.session_lost(p_session bigint, p_names text[], p_tokens bigint[], p_owner text)
RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    SELECT g.name FROM unnest(p_names, p_tokens) AS g(name, token)
     WHERE NOT EXISTS (
        SELECT 1 FROM pgbaton.lease l
         WHERE l.name = g.name AND l.token = g.token AND l.owner = p_owner AND l.session_id = p_session);
END $$;

-- held_grants returns which of the grants (p_names, p_tokens) p_owner
-- still has a row for: what a failed complete_tx did not take over.
--
-- Here and in every function given grants as (names, tokens) arrays, the
-- rows are matched as two sets, l.name = ANY (names) AND l.token = ANY
-- (tokens), which is exact (a token is drawn for one grant of one name),
-- rather than by joining the arrays unnested: the plan, made once per
-- connection, is then an index scan of the names whatever the statistics
-- said when it was made. The join, planned while the table was empty and
-- vacuumed (a drained queue), hashed the arrays and read every row of the
-- table on every call for the connection's life
-- (TestLeaseArraysReadOnlyTheirRows).
CREATE FUNCTION pgbaton.held_grants(p_names text[], p_tokens bigint[], p_owner text)
RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    SELECT l.name FROM pgbaton.lease l
     WHERE l.name = ANY (p_names) AND l.token = ANY (p_tokens) AND l.owner = p_owner;
END $$;

-- waiters_ahead is how many live waiters of p_name (a lease or a group)
-- are before p_waiter in the queue (higher rank, or the same rank and
-- older): all of them when p_waiter is NULL, not registered or an
-- observer (a caller that did not wait comes after everyone who does).
-- Observers are never ahead. A free lease goes to the first live waiter:
-- an attempt with waiters ahead of it is refused.
CREATE FUNCTION pgbaton.waiters_ahead(p_name text, p_waiter text)
RETURNS integer
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $$
DECLARE
    mine   bigint;
    mine_r integer;
BEGIN
    IF p_waiter IS NOT NULL THEN
        SELECT w.seq, w.rank INTO mine, mine_r FROM pgbaton.lease_waiter w WHERE w.name = p_name AND w.waiter = p_waiter;
    END IF;
    IF mine_r IS NULL THEN
        RETURN (SELECT count(*) FROM pgbaton.lease_waiter w
                 WHERE w.name = p_name AND w.rank IS NOT NULL AND w.waiter IS DISTINCT FROM p_waiter
                   AND pgbaton.waiter_alive(w.session_id, w.expires_at));
    END IF;
    -- Two ranges of the queue's index: higher ranks, then the same rank
    -- and older.
    RETURN (SELECT count(*) FROM pgbaton.lease_waiter w
             WHERE w.name = p_name AND w.rank > mine_r
               AND pgbaton.waiter_alive(w.session_id, w.expires_at))
         + (SELECT count(*) FROM pgbaton.lease_waiter w
             WHERE w.name = p_name AND w.rank = mine_r AND w.seq < mine
               AND pgbaton.waiter_alive(w.session_id, w.expires_at));
END $$;

-- requeue puts waiter p_waiter back at the end of p_name's queue when it
-- is not in it: the queue is unlogged, so a crash or a failover empties
-- it, and a waiter that polls has no LISTEN connection to register it
-- again; without this it would look behind every waiter forever. A waiter
-- in the queue keeps its place, bound to p_session, the caller's session
-- now; a NULL p_waiter does nothing. It counts
-- as listening: a listener's own registration again (wait_for) may come
-- later, and a listener not notified would wait for its timer (after a
-- switchover the HA run's clients worked again 3 s later than before),
-- unless p_listens says it polls: then this is its registration, made by
-- its first look (lease_attempt) rather than by a wait_for of its own.
CREATE FUNCTION pgbaton.requeue(p_name text, p_waiter text, p_group boolean, p_session bigint, p_ttl_ms bigint,
    p_rank integer DEFAULT 0, p_listens boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    cur bigint;
BEGIN
    IF p_waiter IS NULL THEN
        RETURN;
    END IF;
    SELECT w.session_id INTO cur FROM pgbaton.lease_waiter w WHERE w.name = p_name AND w.waiter = p_waiter;
    IF FOUND THEN
        -- Bound to the caller's session now: one that ended (a failover
        -- outlasting the TTL) made the waiter dead to the queue, and it
        -- was never woken.
        IF p_session IS NOT NULL AND cur IS DISTINCT FROM p_session THEN
            UPDATE pgbaton.lease_waiter w SET session_id = p_session WHERE w.name = p_name AND w.waiter = p_waiter;
        END IF;
        RETURN;
    END IF;
    INSERT INTO pgbaton.lease_waiter AS w (name, waiter, is_group, owner, session_id, expires_at, listens, rank)
    VALUES (p_name, p_waiter, p_group, (SELECT s.owner FROM pgbaton.lease_session s WHERE s.id = p_session), p_session,
            clock_timestamp() + p_ttl_ms * interval '1 millisecond', coalesce(p_listens, true), coalesce(p_rank, 0))
    ON CONFLICT (name, waiter) DO NOTHING;
END $$;

-- lease_attempt tries to take the lease name for owner for ttl_ms. When it
-- is granted, acquired is true and token/expires_at are the new grant's.
-- When someone holds it, acquired is false and token/expires_at/holder
-- describe the current holder, so a waiter knows when to look again; db_now
-- is the database clock at that moment. metadata, when not NULL, replaces
-- the row's metadata on a grant. A grant is bound to p_session when given,
-- and a lease counts as held while its session is alive. Like every
-- function that grants a token, it draws it with token_base and
-- token_draw. During a failover grace a lease nobody holds is not granted
-- either: acquired is false, holder NULL, and expires_at and grace_until
-- are the grace's end. A lease nobody holds goes to the oldest live waiter
-- (the wait queue, wait_for): an attempt with waiters ahead of it (all of
-- them without p_waiter, the caller's registration) is refused, with
-- holder NULL, ahead their number, and expires_at a TTL from now (it is
-- woken when its turn comes). A waiter granted the lease leaves the queue.
-- A waiter refused a held lease learns its place too (ahead).
-- p_lock_delay_ms is the new grant's lock-delay (0 to lock_delay_max_ms;
-- see lease_free_at). A lost grant whose lock-delay has not ended is not
-- granted either: acquired is false, holder and token are the lost
-- grant's, and expires_at and lock_delay_until are the delay's end. The
-- longest TTL in use counts a grant's lock-delay in its TTL, so a failover
-- grace also outlasts the delay of a grant the failover lost.
-- A waiter not in the queue yet is put at its end (requeue), so a waiter
-- that polls (p_listens false) needs no wait_for: its first look refused
-- is its registration, and a grant removes it. A waiter woken by NOTIFY
-- must register with wait_for first, which orders it against releases.
CREATE FUNCTION pgbaton.lease_attempt(p_name text, p_owner text, p_ttl_ms bigint, p_metadata jsonb DEFAULT NULL,
    p_session bigint DEFAULT NULL, p_ref uuid DEFAULT NULL, p_waiter text DEFAULT NULL, p_lock_delay_ms bigint DEFAULT 0,
    p_rank integer DEFAULT 0, p_listens boolean DEFAULT true,
    OUT acquired boolean, OUT token bigint, OUT expires_at timestamptz, OUT holder text, OUT db_now timestamptz,
    OUT grace_until timestamptz, OUT ahead integer, OUT lock_delay_until timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    cur pgbaton.lease%ROWTYPE;
    t   timestamptz;
    sid bigint;
    present boolean;
    locked  boolean := false;
    until   timestamptz;
    free_at timestamptz;
    se      timestamptz;
    epoch   bigint;
    grace   timestamptz;
BEGIN
    PERFORM pgbaton.lease_check_args(p_name, p_owner, p_ttl_ms);
    IF p_lock_delay_ms IS NULL OR p_lock_delay_ms < 0 OR p_lock_delay_ms > pgbaton.lock_delay_max_ms() THEN
        RAISE EXCEPTION 'pgbaton: lock_delay_ms must be 0 to %, got %', pgbaton.lock_delay_max_ms(), p_lock_delay_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    sid := pgbaton.session_of(p_session, p_owner);
    PERFORM pgbaton.requeue(p_name, p_waiter, false, sid, p_ttl_ms, p_rank, p_listens);
    LOOP
        -- Look before locking: an attempt on a live lease takes no row lock
        -- and no transaction id, so contended attempts write no WAL. The
        -- second time round the row is locked, and the token is drawn only
        -- while that lock is held, so grants of a name get strictly
        -- increasing tokens in the order they happen.
        IF locked THEN
            SELECT * INTO cur FROM pgbaton.lease l WHERE l.name = p_name FOR UPDATE;
        ELSE
            SELECT * INTO cur FROM pgbaton.lease l WHERE l.name = p_name;
        END IF;
        present := FOUND;
        se := pgbaton.session_expiry(cur.session_id);
        until := pgbaton.lease_expiry(cur.expires_at, se);
        free_at := pgbaton.lease_free_at(cur.expires_at, se, cur.lock_delay_ms);
        -- Held, whether found so at the look or granted to someone else
        -- between the look and the lock.
        IF present AND until > clock_timestamp() THEN
            -- A request sent again finds the grant it made.
            acquired := coalesce(cur.grant_ref = p_ref AND cur.owner = p_owner, false);
            token := cur.token; holder := cur.owner;
            -- A waiter learns its place: one that polls looks again soon
            -- only at the head of the queue.
            ahead := CASE WHEN p_waiter IS NULL OR acquired THEN 0 ELSE pgbaton.waiters_ahead(p_name, p_waiter) END;
            expires_at := CASE WHEN acquired THEN cur.expires_at ELSE until END;
            db_now := clock_timestamp();
            RETURN;
        END IF;
        -- Lost, and in its lock-delay: nobody is granted it before free_at.
        IF present AND free_at > clock_timestamp() THEN
            acquired := false; token := cur.token; holder := cur.owner;
            ahead := CASE WHEN p_waiter IS NULL THEN 0 ELSE pgbaton.waiters_ahead(p_name, p_waiter) END;
            expires_at := free_at; lock_delay_until := free_at; db_now := clock_timestamp();
            RETURN;
        END IF;
        -- Free or expired: not granted during a failover grace (before any
        -- row is made or locked). Attempts on live leases skip this.
        IF epoch IS NULL THEN
            SELECT g.epoch, g.grace_until INTO epoch, grace FROM pgbaton.grant_state() g;
        END IF;
        IF grace IS NOT NULL THEN
            acquired := false; token := coalesce(cur.token, 0); holder := NULL; ahead := 0;
            expires_at := grace; grace_until := grace; db_now := clock_timestamp();
            RETURN;
        END IF;
        -- Asked at the look and again once the row is locked: wait_for
        -- locks the row to share, so a registration made since the look
        -- is either seen the second time (it committed before this lock)
        -- or comes after this grant's commit and sees the grant.
        ahead := pgbaton.waiters_ahead(p_name, p_waiter);
        IF ahead > 0 THEN
            acquired := false; token := coalesce(cur.token, 0); holder := NULL;
            db_now := clock_timestamp(); expires_at := db_now + p_ttl_ms * interval '1 millisecond';
            RETURN;
        END IF;
        -- Free or expired, and locked: grant it.
        EXIT WHEN locked AND present;
        IF NOT present THEN
            INSERT INTO pgbaton.lease (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING;
        END IF;
        -- The session first, the lease row second: closing a session locks
        -- it and then the leases bound to it.
        sid := pgbaton.session_hold(sid);
        -- Round again to lock the row (or, if it was deleted under us by a
        -- completion, to make it again).
        locked := true;
    END LOOP;
    t := clock_timestamp();
    PERFORM pgbaton.note_ttl(p_ttl_ms + p_lock_delay_ms);
    UPDATE pgbaton.lease l
       SET owner = p_owner, token = pgbaton.token_draw(pgbaton.token_base(epoch)), session_id = sid, grant_ref = p_ref,
           acquired_at = t, renewed_at = t, expires_at = t + p_ttl_ms * interval '1 millisecond',
           metadata = coalesce(p_metadata, l.metadata), lock_delay_ms = p_lock_delay_ms
     WHERE l.name = p_name
    RETURNING l.token, l.expires_at INTO token, expires_at;
    acquired := true; holder := p_owner; db_now := t; ahead := 0;
    IF p_waiter IS NOT NULL THEN
        DELETE FROM pgbaton.lease_waiter w WHERE w.name = p_name AND w.waiter = p_waiter;
    END IF;
    -- A new term of an election: its observers hear of it at commit. Only
    -- elections notify in the grant's transaction (see notify_waiters for
    -- what that costs); they change hands rarely.
    IF p_metadata ? 'rank' THEN
        PERFORM pgbaton.notify_observers(p_name);
    END IF;
END $$;

-- try_acquire takes the lease name for owner for ttl_ms: one row (token,
-- expires_at) when granted, no row when someone else holds it.
CREATE FUNCTION pgbaton.try_acquire(p_name text, p_owner text, p_ttl_ms bigint)
RETURNS TABLE (token bigint, expires_at timestamptz)
LANGUAGE sql AS $$
    SELECT a.token, a.expires_at FROM pgbaton.lease_attempt(p_name, p_owner, p_ttl_ms) a WHERE a.acquired
$$;

-- lease_attempt_all tries to take every lease named in p_names for
-- p_owner at once: it grants all of them or none. The names are taken in
-- byte order (COLLATE "C"), the one order every caller of this function
-- and every ordered wait for a set (leasetable's AcquireAll) takes them
-- in, so two calls for {a, b} and {b, a} never wait for each other in a
-- cycle. Each name is attempted as lease_attempt attempts it without a
-- waiter: a name held, or free but waited for (its waiters go first), or
-- held back by a failover grace, is refused. The first name refused ends
-- the call: the grants made before it are rolled back with the block's
-- subtransaction (their row locks go too; the tokens they drew are never
-- used), and one row describes the refusal as lease_attempt's columns do
-- (acquired false, name the name refused). When all are granted it
-- returns one row per name in that order, each with its own token, all
-- bound to p_session and marked with request id p_ref: a request sent
-- again after a lost reply finds them all, and release_ref gives them all
-- back. With p_keep_prefix a refusal keeps the grants made before it: the
-- rows of those come first, then the refusal's. That is one step of an
-- ordered wait for a set (take the names in order, holding those taken,
-- wait in the queue of the one refused, go on after it), in one round
-- trip. Empty sets, more than 1000 names, duplicate names and invalid
-- names are refused with invalid_parameter_value. p_lock_delay_ms is each
-- grant's lock-delay and lock_delay_until the refusal's, as in
-- lease_attempt.
CREATE FUNCTION pgbaton.lease_attempt_all(p_names text[], p_owner text, p_ttl_ms bigint,
    p_session bigint DEFAULT NULL, p_ref uuid DEFAULT NULL, p_keep_prefix boolean DEFAULT false,
    p_lock_delay_ms bigint DEFAULT 0,
    OUT name text, OUT acquired boolean, OUT token bigint, OUT expires_at timestamptz, OUT holder text,
    OUT db_now timestamptz, OUT grace_until timestamptz, OUT ahead integer, OUT lock_delay_until timestamptz)
RETURNS SETOF record
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    n      text;
    a      record;
    names  text[];
    tokens bigint[] := '{}';
    exps   timestamptz[] := '{}';
BEGIN
    IF p_names IS NULL OR cardinality(p_names) = 0 OR cardinality(p_names) > 1000 THEN
        RAISE EXCEPTION 'pgbaton: a lease set must have 1 to 1000 names, got %', coalesce(cardinality(p_names), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    names := ARRAY(SELECT DISTINCT x COLLATE "C" FROM unnest(p_names) x ORDER BY 1);
    IF cardinality(names) <> cardinality(p_names) THEN
        RAISE EXCEPTION 'pgbaton: a lease set names a lease twice' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH n IN ARRAY names LOOP
        PERFORM pgbaton.lease_check_args(n, p_owner, p_ttl_ms);
    END LOOP;
    BEGIN
        FOREACH n IN ARRAY names LOOP
            SELECT * INTO a FROM pgbaton.lease_attempt(n, p_owner, p_ttl_ms, NULL, p_session, p_ref, NULL, p_lock_delay_ms);
            IF NOT a.acquired THEN
                -- Kept in variables, which the rollback below leaves alone.
                name := n; acquired := false; token := a.token; expires_at := a.expires_at; holder := a.holder;
                db_now := a.db_now; grace_until := a.grace_until; ahead := a.ahead; lock_delay_until := a.lock_delay_until;
                IF p_keep_prefix THEN
                    RETURN QUERY SELECT g.name, true, g.token, g.expires_at, p_owner, a.db_now, NULL::timestamptz, 0,
                                        NULL::timestamptz
                                   FROM unnest(names[1:cardinality(tokens)], tokens, exps) WITH ORDINALITY
                                        AS g(name, token, expires_at, i) ORDER BY g.i;
                    RETURN NEXT;
                    RETURN;
                END IF;
                RAISE EXCEPTION USING ERRCODE = 'PB002';
            END IF;
            tokens := tokens || a.token;
            exps := exps || a.expires_at;
        END LOOP;
    EXCEPTION WHEN SQLSTATE 'PB002' THEN
        RETURN NEXT;
        RETURN;
    END;
    RETURN QUERY SELECT g.name, true, g.token, g.expires_at, p_owner, clock_timestamp(), NULL::timestamptz, 0,
                        NULL::timestamptz
                   FROM unnest(names, tokens, exps) WITH ORDINALITY AS g(name, token, expires_at, i) ORDER BY g.i;
END $$;

-- try_acquire_all takes every lease named in p_names for owner for
-- ttl_ms, or none (lease_attempt_all): one row (name, token, expires_at)
-- per name, in byte order, when all are granted; no row when any is held.
CREATE FUNCTION pgbaton.try_acquire_all(p_names text[], p_owner text, p_ttl_ms bigint)
RETURNS TABLE (name text, token bigint, expires_at timestamptz)
LANGUAGE sql AS $$
    SELECT a.name, a.token, a.expires_at FROM pgbaton.lease_attempt_all(p_names, p_owner, p_ttl_ms) a WHERE a.acquired
$$;

-- renew extends the lease (name, owner, token) to ttl_ms from now and
-- returns its expiry; no row when that grant is no longer valid. It never
-- inserts a row and never takes over an expired or stolen lease. Its TTL
-- counts for the failover grace as a grant's does.
CREATE FUNCTION pgbaton.renew(p_name text, p_owner text, p_token bigint, p_ttl_ms bigint)
RETURNS TABLE (expires_at timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    t timestamptz;
BEGIN
    PERFORM pgbaton.lease_check_args(p_name, p_owner, p_ttl_ms);
    PERFORM pgbaton.note_ttl(p_ttl_ms);
    t := clock_timestamp();
    RETURN QUERY
    UPDATE pgbaton.lease l
       SET renewed_at = t, expires_at = t + p_ttl_ms * interval '1 millisecond'
     WHERE l.name = p_name AND l.owner = p_owner AND l.token = p_token
       AND pgbaton.lease_expiry(l.expires_at, pgbaton.session_expiry(l.session_id)) > t
    RETURNING pgbaton.lease_expiry(l.expires_at, pgbaton.session_expiry(l.session_id));
END $$;

-- reserved_pair_hi is the first half of the (int4, int4) advisory keys
-- the lease protocol takes for itself: (reserved_pair_hi(), slot) is a
-- listen slot (listen_start), (reserved_pair_hi() + 1, hashtext(group))
-- a group's gate (group_gate), (reserved_pair_hi() + 2, hashtext(name))
-- the lock of a wait queue (queue_lock) and (reserved_pair_hi() + 3,
-- session_lock_key(id)) a lease session's (session_hold). 1885495924 is 0x70626274,
-- "pbbt"; the Go advisory package refuses pairs with any of these first
-- halves to its users (advisory.ReservedPairHi, which must stay equal to
-- it).
CREATE FUNCTION pgbaton.reserved_pair_hi()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 1885495924
$$;

-- group_gate takes the advisory lock that orders registrations of waiters
-- on a group (wait_for, exclusive, held for an instant) with whatever
-- makes a lease of the group claimable: registering items (register),
-- releasing them (release, release_many, force_release_lease), each
-- shared, taken after its change and held until it commits, before it
-- looks for waiters. Whichever comes second sees the other: a waiter
-- registering after such a change waits for it to commit and then finds
-- the lease free; a change after the registration sees the waiter and
-- wakes it. New rows cannot be locked, and a row lock would make waiters
-- wait for every open transaction that holds a row of the group (a
-- CompleteTx still running), holding up every Register behind them.
-- The key is the pair (reserved_pair_hi() + 1, hashtext(group)), which
-- the Go advisory package refuses to its users. Two groups that hash alike share a gate,
-- which costs only some waiting. plpgsql, so that a release, which takes
-- it every time, does not plan it again at every call.
CREATE FUNCTION pgbaton.group_gate(p_group text, p_exclusive boolean)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_exclusive THEN
        PERFORM pg_advisory_xact_lock(pgbaton.reserved_pair_hi() + 1, hashtext(p_group));
    ELSE
        PERFORM pg_advisory_xact_lock_shared(pgbaton.reserved_pair_hi() + 1, hashtext(p_group));
    END IF;
END $$;

-- queue_lock orders the wake-ups of the queue of p_name (notify_waiters),
-- held until the caller commits: a waiter that leaves the queue
-- (stop_waiting) removes its registration and then wakes whoever is owed
-- its turn, while a release's wake-up reads the queue after the release
-- committed. Run at once, the wake-up could read the leaving waiter's
-- registration (not yet deleted) and wake it, and the removal could find
-- nothing free (the release not yet committed): nobody would take the
-- turn. One after the other, the second sees both changes. The key is the
-- pair (reserved_pair_hi() + 2, hashtext(name)), refused to users like the
-- gate's; taken after the gate where both are, never before, and for
-- several names in the order of their keys.
CREATE FUNCTION pgbaton.queue_lock(p_name text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(pgbaton.reserved_pair_hi() + 2, hashtext(p_name));
END $$;

-- wait_for registers waiter as waiting for lease name (or for any lease of
-- group name when p_group): it joins the end of the name's queue, or keeps
-- its place when registered already. The waiter waits while its session
-- p_session lives, or, without one, for p_ttl_ms from the last call: call
-- it again to keep waiting. A waiter that polls passes p_listens false:
-- its turn sends no NOTIFY, and a release it alone waits for reports no
-- waiters. Call it in its own transaction, after LISTEN
-- pgbaton_lease and before looking at the lease again (passing the waiter
-- to lease_attempt or claim). For a name, the FOR SHARE lock orders it
-- against releases: a release already running commits first (and the next
-- look sees the lease free), a later one sees this registration and
-- notifies. For a group, the group's gate does the same (see group_gate),
-- and never waits for a row lock.
--
-- p_rank places a candidate of an election in the queue (lease_waiter):
-- NULL registers an observer. A candidate that outranks the leader of
-- the election asks it to resign (request_resign), so a preferred
-- candidate gets the term at once rather than when the leader goes.
CREATE FUNCTION pgbaton.wait_for(p_name text, p_waiter text, p_group boolean DEFAULT false,
    p_session bigint DEFAULT NULL, p_ttl_ms bigint DEFAULT 60000, p_listens boolean DEFAULT true,
    p_rank integer DEFAULT 0, p_drain boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    o    text;
    meta jsonb;
BEGIN
    PERFORM pgbaton.lease_check_args(p_name, p_waiter, p_ttl_ms);
    SELECT s.owner INTO o FROM pgbaton.lease_session s WHERE s.id = p_session;
    o := coalesce(o, nullif(split_part(p_waiter, '/', 1), ''));
    -- The lease row before the waiter's, the order of a grant to this
    -- waiter (lease_attempt): the other way round, a registration made
    -- again while that grant ran deadlocked with it.
    IF NOT coalesce(p_group, false) THEN
        SELECT l.metadata INTO meta FROM pgbaton.lease l WHERE l.name = p_name FOR SHARE;
    END IF;
    INSERT INTO pgbaton.lease_waiter AS w (name, waiter, is_group, owner, session_id, expires_at, listens, rank, drain)
    VALUES (p_name, p_waiter, coalesce(p_group, false), o, p_session,
            clock_timestamp() + p_ttl_ms * interval '1 millisecond', coalesce(p_listens, true), p_rank, coalesce(p_drain, false))
    ON CONFLICT (name, waiter) DO UPDATE SET expires_at = EXCLUDED.expires_at, listens = EXCLUDED.listens, rank = EXCLUDED.rank;
    IF p_group THEN
        PERFORM pgbaton.group_gate(p_name, true);
    ELSIF p_rank > pgbaton.election_rank(meta) THEN
        PERFORM pgbaton.request_resign(p_name, format('candidate %s of rank %s waits', o, p_rank), o);
    END IF;
END $$;

-- stop_waiting removes a registration made by wait_for. A waiter that
-- leaves the head of the queue of a free lease hands its turn on: the next
-- one is woken (notify_waiters).
CREATE FUNCTION pgbaton.stop_waiting(p_name text, p_waiter text)
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
    DELETE FROM pgbaton.lease_waiter w WHERE w.name = p_name AND w.waiter = p_waiter;
    IF FOUND THEN
        PERFORM pgbaton.notify_waiters(ARRAY[p_name]);
    END IF;
END $$;

-- group_free is how many leases of group p_group can be claimed now (free,
-- or expired), counting up to p_cap: what a group's waiters can be given.
-- Free and expired rows are counted apart, each on its own index: one
-- query over both (owner IS NULL OR expired) has no index, and with
-- enable_seqscan = off its disabled seq scan's cost sent it to JIT
-- (55-160 ms per Register measured).
CREATE FUNCTION pgbaton.group_free(p_group text, p_cap integer)
RETURNS integer
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $$
DECLARE
    n integer;
BEGIN
    n := (SELECT count(*) FROM (SELECT 1 FROM pgbaton.lease l
                                 WHERE l.lease_group = p_group AND l.owner IS NULL LIMIT p_cap) f);
    IF n < p_cap THEN
        n := n + (SELECT count(*) FROM (
                      SELECT 1 FROM pgbaton.lease l
                       WHERE l.lease_group = p_group AND l.owner IS NOT NULL
                         AND pgbaton.lease_free_at(l.expires_at, pgbaton.session_expiry(l.session_id), l.lock_delay_ms) <= clock_timestamp()
                       LIMIT p_cap - n) e);
    END IF;
    RETURN n;
END $$;

-- group_counts is what group p_group holds now: free items (never claimed,
-- or released), items held, and items whose holder lost them (expired:
-- claimable again). Completed items are deleted, so a group whose three
-- counts are 0 is drained: every item registered in it was completed. One
-- statement over the two partial indexes of group rows; it reads every row
-- of the group, so it is for batch jobs, dashboards and tests, not for a
-- worker's every claim (group_drained answers "anything left?" in two
-- index probes).
CREATE FUNCTION pgbaton.group_counts(p_group text, OUT free integer, OUT held integer, OUT expired integer)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $$
BEGIN
    IF p_group IS NULL OR p_group = '' OR octet_length(p_group) > 255 THEN
        RAISE EXCEPTION 'pgbaton: lease group must be 1 to 255 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    free := (SELECT count(*) FROM pgbaton.lease l WHERE l.lease_group = p_group AND l.owner IS NULL);
    SELECT count(*) FILTER (WHERE h.live), count(*) FILTER (WHERE NOT h.live) INTO held, expired
      FROM (SELECT coalesce(pgbaton.lease_expiry(l.expires_at, s.expires_at) > clock_timestamp(), false) AS live
              FROM pgbaton.lease l
              LEFT JOIN pgbaton.lease_session s ON s.id = l.session_id
             WHERE l.lease_group = p_group AND l.owner IS NOT NULL) h;
END $$;

COMMENT ON FUNCTION pgbaton.group_counts(text) IS
    'pgbaton: a work group''s items now: free, held, expired (claimable again); all 0 when drained (every item completed)';

-- group_drained is whether group p_group holds no item at all, free or
-- held: a drained work queue, every item completed. It asks after the
-- changes in flight: a row that a completion still running deletes (or a
-- claim locks) is waited for (FOR KEY SHARE, which a renewal's update does
-- not block), so a drain waiter that looks while the last item's
-- completion has not committed yet gets the answer of its commit, and one
-- that looked earlier is woken by it (wake_drained). One row of each
-- partial index of group rows at most is locked, for the statement.
CREATE FUNCTION pgbaton.group_drained(p_group text)
RETURNS boolean
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
    PERFORM 1 FROM pgbaton.lease l WHERE l.lease_group = p_group AND l.owner IS NULL LIMIT 1 FOR KEY SHARE;
    IF FOUND THEN
        RETURN false;
    END IF;
    PERFORM 1 FROM pgbaton.lease l WHERE l.lease_group = p_group AND l.owner IS NOT NULL LIMIT 1 FOR KEY SHARE;
    RETURN NOT FOUND;
END $$;

-- wake_drained wakes the waiters that stop when their group is drained
-- (wait_for's p_drain: ClaimUntilDrained) of the groups p_groups, in which
-- a completion deleted items: any of them may have been the last. Each
-- looks again (group_drained). A group nobody waits on that way costs one
-- probe of lease_waiter's key, so completions in a busy queue pay almost
-- nothing, and the waiters of ClaimWait are not woken for nothing. Sent
-- inside the completion's transaction, the NOTIFY is delivered when it
-- commits, and not at all when it rolls back.
CREATE FUNCTION pgbaton.wake_drained(p_groups text[])
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
    PERFORM pg_notify('pgbaton_lease', w.waiter)
       FROM pgbaton.lease_waiter w
      WHERE w.name = ANY (p_groups) AND w.is_group AND w.drain AND w.listens
        AND pgbaton.waiter_alive(w.session_id, w.expires_at);
END $$;

-- notify_waiters wakes the waiters registered (wait_for) for any of
-- p_names, lease or group names, and for the groups of the leases named,
-- as many as there are leases free for them now, oldest first: one NOTIFY
-- per waiter woken, payload the waiter's id (a lease that nobody holds
-- wakes its queue's head; a group with three free leases its three oldest
-- waiters). Every name's queue is read once, however often it appears.
--
-- Releases do not notify: a client calls notify_waiters after the release
-- committed, in a statement of its own, when the release reported waiters.
-- A NOTIFY takes a database-wide lock at commit and holds it until the
-- commit is flushed, so releases that notify in their own transaction
-- commit one flush at a time (pgbench, 50 clients: an UPDATE alone 3,846
-- commits/s, with a NOTIFY in its transaction 1,575, the NOTIFY sent after
-- it 2,536). Sent on its own, the NOTIFY's transaction writes no WAL and
-- waits for no flush.
CREATE FUNCTION pgbaton.notify_waiters(p_names text[])
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    q      record;
    free   integer;
    queues text[];
BEGIN
    queues := p_names || ARRAY(SELECT l.lease_group FROM pgbaton.lease l
                                WHERE l.name = ANY (p_names) AND l.lease_group IS NOT NULL);
    -- Nobody to wake. A waiter that registers now waits for the caller's
    -- change to commit (the lease row's lock, or the group's gate, which
    -- every caller holds or has committed) and then finds it; one leaving
    -- now is still seen here. Without this every Register of a group took
    -- the queue lock below and held it to its commit: a fleet's Registers
    -- into one group committed one at a time (500 clients on 2 cores:
    -- 0.9-1.2 s each).
    IF NOT EXISTS (SELECT 1 FROM pgbaton.lease_waiter w WHERE w.name = ANY (queues)) THEN
        RETURN;
    END IF;
    -- Each queue's wake-ups one at a time (queue_lock): a waiter leaving
    -- the head (stop_waiting) and a release's wake-up in flight would each
    -- miss the other's change, and the turn would be lost.
    PERFORM pgbaton.queue_lock(x.name)
       FROM (SELECT n.name FROM unnest(queues) n(name)
              GROUP BY n.name ORDER BY hashtext(n.name)) x;
    FOR q IN
        SELECT DISTINCT w.name, w.is_group FROM pgbaton.lease_waiter w
         WHERE w.name = ANY (queues)
    LOOP
        IF q.is_group THEN
            free := pgbaton.group_free(q.name, (SELECT count(*) FROM pgbaton.lease_waiter w WHERE w.name = q.name)::integer);
        ELSE
            free := CASE WHEN EXISTS (
                        SELECT 1 FROM pgbaton.lease l
                         WHERE l.name = q.name
                           AND pgbaton.lease_expiry(l.expires_at, pgbaton.session_expiry(l.session_id)) > clock_timestamp()) THEN 0 ELSE 1 END;
        END IF;
        -- Waiters that poll are not notified: they find their turn at
        -- their next look.
        PERFORM pg_notify('pgbaton_lease', h.waiter)
           FROM (SELECT w.waiter, w.listens FROM pgbaton.lease_waiter w
                  WHERE w.name = q.name AND w.is_group = q.is_group AND w.rank IS NOT NULL
                    AND pgbaton.waiter_alive(w.session_id, w.expires_at)
                  ORDER BY w.rank DESC NULLS LAST, w.seq LIMIT free) h
          WHERE h.listens;
    END LOOP;
END $$;

-- Listen slots: at most p_slots clients of the database listen at once.
-- A NOTIFY signals every backend that listens in the database, on any
-- channel, and each wakes to read the queue, so a fleet whose clients all
-- listened paid per release once per client (pgbench, 50 clients, NOTIFY
-- alone: 1,944/s with no listener, 178/s with 200). A client listens only
-- while holding a slot, a session-level advisory lock (key1
-- reserved_pair_hi(), 1885495924; key2 the slot) on its LISTEN connection: it ends with the
-- connection, so a client that dies frees its slot without anyone
-- cleaning up. A client without a slot makes its waiters poll. The slot
-- held is kept in the session setting pgbaton.listen_slot ('' for none).
--
-- listen_start takes a free slot of 0 .. p_slots - 1 (starting at a random
-- one, so clients spread) and LISTENs, returning true; with every slot
-- taken it UNLISTENs and returns false. A session that holds a slot keeps
-- it and LISTENs.
CREATE FUNCTION pgbaton.listen_start(p_slots integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    first integer;
BEGIN
    IF p_slots IS NULL OR p_slots < 1 OR p_slots > 10000 THEN
        RAISE EXCEPTION 'pgbaton: listen slots must be 1 to 10000, got %', p_slots USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF coalesce(current_setting('pgbaton.listen_slot', true), '') = '' THEN
        first := floor(random() * p_slots)::integer;
        FOR i IN 0 .. p_slots - 1 LOOP
            IF pg_try_advisory_lock(pgbaton.reserved_pair_hi(), (first + i) % p_slots) THEN
                PERFORM set_config('pgbaton.listen_slot', ((first + i) % p_slots)::text, false);
                EXIT;
            END IF;
        END LOOP;
    END IF;
    IF coalesce(current_setting('pgbaton.listen_slot', true), '') = '' THEN
        UNLISTEN pgbaton_lease;
        RETURN false;
    END IF;
    LISTEN pgbaton_lease;
    RETURN true;
END $$;

-- listen_slot_free reports whether some slot of 0 .. p_slots - 1 is free,
-- without taking one. A client asks it on its pool before it opens a
-- LISTEN connection, and opens none while every slot is taken: a fleet
-- whose clients each opened a connection only to learn that spent the
-- server on backend starts while the fleet ran. A shared try-lock fails on
-- a slot a listener holds and conflicts with no other check; it ends with
-- the transaction.
CREATE FUNCTION pgbaton.listen_slot_free(p_slots integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF p_slots IS NULL OR p_slots < 1 OR p_slots > 10000 THEN
        RAISE EXCEPTION 'pgbaton: listen slots must be 1 to 10000, got %', p_slots USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR i IN 0 .. p_slots - 1 LOOP
        IF pg_try_advisory_xact_lock_shared(pgbaton.reserved_pair_hi(), i) THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END $$;

-- listen_stop UNLISTENs and frees the session's slot, if it holds one.
CREATE FUNCTION pgbaton.listen_stop()
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    slot text := coalesce(current_setting('pgbaton.listen_slot', true), '');
BEGIN
    UNLISTEN pgbaton_lease;
    IF slot <> '' THEN
        PERFORM pg_advisory_unlock(pgbaton.reserved_pair_hi(), slot::integer);
        PERFORM set_config('pgbaton.listen_slot', '', false);
    END IF;
END $$;

-- release frees the lease (name, owner, token) and reports whether anyone
-- waits for it or its group (wait_for): if so, the caller wakes them with
-- pgbaton.notify_waiters(ARRAY[name]) once this has committed.
-- released is false, and nothing changes, when that grant was superseded:
-- somebody else's lease is never released. An expired grant nobody took
-- over is still freed (true): no one else held the name in between.
-- release and release_many also unbind the lease from its session.
CREATE FUNCTION pgbaton.release(p_name text, p_owner text, p_token bigint,
                                OUT released boolean, OUT waiters boolean)
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
    released := FOUND;
    IF g IS NOT NULL THEN
        PERFORM pgbaton.group_gate(g, false);
    END IF;
    waiters := released AND EXISTS (SELECT 1 FROM pgbaton.lease_waiter w WHERE w.name = ANY (ARRAY[p_name, g]) AND w.listens);
END $$;

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
    WITH mine AS MATERIALIZED (
        SELECT l.* FROM pgbaton.lease l WHERE l.grant_ref = p_ref)  -- lease_grant_ref_idx
    SELECT array_agg(l.name), array_agg(l.token) INTO names, tokens FROM mine l
     WHERE l.session_id = p_session AND l.owner = p_owner;
    IF names IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT r.name FROM pgbaton.release_many(names, tokens, p_owner) r;
END $$;

-- release_many frees the leases of p_owner named in p_names, each guarded
-- by its token like release, and returns the names freed, each with
-- whether anyone waits for it or its group: the caller passes those to
-- notify_waiters once this has committed. Clients give
-- back many leases at once with it (Close, a grant whose caller gave up).
-- The waiters of the whole batch are looked up once, not row by row.
--
-- p_lost names the grants of the batch that were lost, not released: their
-- holder stopped because its local deadline passed (or it was told of a
-- loss), and gives them back only so that its lease session no longer
-- keeps them. Such a grant with a lock-delay is not freed: it is unbound
-- from the session with the expiry it had (unbound_expiry), so the name is
-- granted again no sooner than that plus the delay (lease_free_at), as if
-- it had not been given back. It is returned too, with waiters false.
CREATE FUNCTION pgbaton.release_many(p_names text[], p_tokens bigint[], p_owner text, p_lost text[] DEFAULT NULL)
RETURNS TABLE (name text, waiters boolean)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    freed   text[];
    groups  text[];
    wait    text[];
    delayed text[];
    lost    text[] := coalesce(p_lost, '{}');
BEGIN
    IF cardinality(lost) > 0 THEN
        WITH k AS (
            UPDATE pgbaton.lease l
               SET expires_at = pgbaton.unbound_expiry(l.expires_at, l.session_id, l.lock_delay_ms), session_id = NULL
             WHERE l.name = ANY (p_names) AND l.token = ANY (p_tokens) AND l.owner = p_owner
               AND l.lock_delay_ms > 0 AND l.name = ANY (lost)
            RETURNING l.name)
        SELECT array_agg(k.name) INTO delayed FROM k;
    END IF;
    WITH r AS (
        UPDATE pgbaton.lease l
           SET owner = NULL, expires_at = NULL, session_id = NULL
         WHERE l.name = ANY (p_names) AND l.token = ANY (p_tokens) AND l.owner = p_owner
           AND NOT (l.name = ANY (coalesce(delayed, '{}')))
        RETURNING l.name, l.lease_group)
    SELECT array_agg(r.name), array_agg(r.lease_group)
      INTO freed, groups FROM r;
    RETURN QUERY SELECT d.name, false FROM unnest(delayed) d(name);
    IF freed IS NULL THEN
        RETURN;
    END IF;
    -- See group_gate. Shared: these never wait for each other, and a
    -- waiter holds one gate, for an instant.
    PERFORM pgbaton.group_gate(x.grp, false)
       FROM (SELECT DISTINCT u.grp FROM unnest(groups) u(grp) WHERE u.grp IS NOT NULL ORDER BY u.grp) x;
    wait := ARRAY(SELECT DISTINCT w.name FROM pgbaton.lease_waiter w WHERE w.name = ANY (freed || groups) AND w.listens);
    RETURN QUERY SELECT f.name, (f.name = ANY (wait) OR coalesce(f.grp = ANY (wait), false))
                   FROM unnest(freed, groups) AS f(name, grp);
END $$;

-- settle_many settles leases of p_owner completed in a transaction
-- (complete_tx) once that transaction has ended: for each name it returns
-- 'gone' (the completion committed, or the lease moved on), 'released'
-- (the transaction rolled back: the lease is released now, so the item is
-- claimable at once rather than when its session ends) or 'busy' (its row
-- is still locked: the transaction is still open; ask again later).
--
-- Each rolled-back lease goes back with its own token: only the names
-- locked here are passed to release_many, each with its token.
CREATE FUNCTION pgbaton.settle_many(p_names text[], p_tokens bigint[], p_owner text)
RETURNS TABLE (name text, state text)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    present   text[];
    un_names  text[];
    un_tokens bigint[];
    freed     text[];
BEGIN
    present := ARRAY(
        SELECT l.name FROM pgbaton.lease l
         WHERE l.name = ANY (p_names) AND l.token = ANY (p_tokens) AND l.owner = p_owner);
    SELECT coalesce(array_agg(u.name ORDER BY u.name), '{}'), coalesce(array_agg(u.token ORDER BY u.name), '{}')
      INTO un_names, un_tokens
      FROM (SELECT l.name, l.token FROM pgbaton.lease l
             WHERE l.name = ANY (present) AND l.token = ANY (p_tokens) AND l.owner = p_owner
               FOR UPDATE OF l SKIP LOCKED) u;
    freed := ARRAY(SELECT r.name FROM pgbaton.release_many(un_names, un_tokens, p_owner) r);
    RETURN QUERY
    SELECT n, CASE WHEN n = ANY (freed) THEN 'released' WHEN n = ANY (present) THEN 'busy' ELSE 'gone' END
      FROM unnest(p_names) n;
END $$;

-- complete deletes the lease row (name, owner, token): a work item is done
-- and must not be claimed again. Guarded like release. Tokens stay
-- monotonic if the name is used again: they come from one sequence.
CREATE FUNCTION pgbaton.complete(p_name text, p_owner text, p_token bigint)
RETURNS boolean
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    grp text;
BEGIN
    PERFORM pgbaton.lease_check_args(p_name, p_owner, 1);
    DELETE FROM pgbaton.lease l WHERE l.name = p_name AND l.owner = p_owner AND l.token = p_token
    RETURNING l.lease_group INTO grp;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF grp IS NOT NULL THEN
        PERFORM pgbaton.wake_drained(ARRAY[grp]);
    END IF;
    RETURN true;
END $$;

-- complete_many deletes the rows of finished work items of p_owner in one
-- call, each guarded by its (name, token) like complete, and returns the
-- names deleted. Matching names and tokens as two sets is exact: every
-- token is granted to one row only. A function rather than a plain DELETE
-- so that it gets the settings at the top of this file.
CREATE FUNCTION pgbaton.complete_many(p_names text[], p_tokens bigint[], p_owner text)
RETURNS SETOF text
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    done   text[];
    groups text[];
BEGIN
    -- Matched as two sets: see held_grants.
    WITH gone AS (
        DELETE FROM pgbaton.lease l
         WHERE l.name = ANY (p_names) AND l.token = ANY (p_tokens) AND l.owner = p_owner
        RETURNING l.name, l.lease_group)
    SELECT array_agg(g.name), array_agg(DISTINCT g.lease_group) FILTER (WHERE g.lease_group IS NOT NULL)
      INTO done, groups FROM gone g;
    IF groups IS NOT NULL THEN
        PERFORM pgbaton.wake_drained(groups);
    END IF;
    RETURN QUERY SELECT unnest(done);
END $$;

-- complete_tx completes work items inside the caller's transaction: it
-- deletes the rows of p_owner's leases (names and tokens as in
-- release_many), or, if any of them is no longer held with its token
-- (taken over, released, completed), deletes nothing and raises PB001,
-- which aborts the caller's transaction: the work's effects and the
-- completion commit together or not at all. Expiry alone does not fail it:
-- nobody else can have worked on an item whose token did not move, and the
-- row lock taken here keeps claimers off it until the transaction ends.
CREATE FUNCTION pgbaton.complete_tx(p_names text[], p_tokens bigint[], p_owner text)
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    missing text[];
    groups text[];
    cur_token bigint;
BEGIN
    IF p_names IS NULL OR p_tokens IS NULL OR cardinality(p_names) <> cardinality(p_tokens) OR cardinality(p_names) = 0 THEN
        RAISE EXCEPTION 'pgbaton: complete_tx needs as many names as tokens, at least one' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH gone AS (
        DELETE FROM pgbaton.lease l
         WHERE l.name = ANY (p_names) AND l.token = ANY (p_tokens) AND l.owner = p_owner
        RETURNING l.name, l.lease_group)
    SELECT (SELECT array_agg(n ORDER BY n) FROM unnest(p_names) n WHERE n NOT IN (SELECT g.name FROM gone g)),
           (SELECT array_agg(DISTINCT g.lease_group) FROM gone g WHERE g.lease_group IS NOT NULL)
      INTO missing, groups;
    IF missing IS NOT NULL THEN
        SELECT l.token INTO cur_token FROM pgbaton.lease l WHERE l.name = missing[1];
        RAISE EXCEPTION 'pgbaton: not completed: leases % are no longer held with their tokens (taken over, released or completed)', missing
            USING ERRCODE = 'PB001',
                  DETAIL = format('presented=%s current=%s reason=%s name=%s',
                                  p_tokens[array_position(p_names, missing[1])], coalesce(cur_token, 0), 'not held', missing[1]),
                  HINT = 'Roll back: the work was done under a lease that moved on; another holder does it again.';
    END IF;
    IF groups IS NOT NULL THEN
        PERFORM pgbaton.wake_drained(groups);
    END IF;
END $$;

-- register creates free lease rows in group for names (shards, work items,
-- semaphore slots) and returns how many were new. Existing rows of the same
-- group are left alone; a name that exists outside the group is an error.
-- register keeps the order of p_names: the first name is claimed first.
-- When it created rows and anyone waits for the group (wait_for), it wakes
-- them with one NOTIFY on channel pgbaton_lease, payload: the group's
-- name, however many rows (see notify_waiters for what a NOTIFY costs).
CREATE FUNCTION pgbaton.register(p_group text, p_names text[])
RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
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
    -- seq comes from the column default, drawn row by row in this order.
    INSERT INTO pgbaton.lease (name, lease_group)
    SELECT u.x, p_group
      FROM (SELECT DISTINCT ON (x) x, i FROM unnest(p_names) WITH ORDINALITY AS a(x, i) ORDER BY x, i) u
     ORDER BY u.i
    ON CONFLICT (name) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    SELECT l.name INTO bad FROM pgbaton.lease l
     WHERE l.name = ANY (p_names) AND l.lease_group IS DISTINCT FROM p_group LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'pgbaton: lease % exists outside group %', bad, p_group USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF n > 0 THEN
        -- Held to commit: a waiter registering meanwhile waits for the new
        -- rows to commit (and then claims them), or registered before and
        -- is seen here.
        PERFORM pgbaton.group_gate(p_group, false);
        PERFORM pgbaton.notify_waiters(ARRAY[p_group]);
    END IF;
    RETURN n;
END $$;

-- claim grants owner up to n leases of group that are free (never held,
-- released) or expired, oldest first (by seq, the order of registration),
-- each with a new token, skipping rows other claims have locked (FOR UPDATE
-- SKIP LOCKED), so concurrent workers never wait on or get the same row.
-- Rows come back in that order. Grants are bound to p_session; expired
-- rows are those whose lease_free_at (their own expiry and their
-- session's, if any, plus the lost grant's lock-delay) has passed. Claims
-- grant without a lock-delay: a work item, shard or semaphore slot whose
-- worker died is claimed again at its expiry (fence its effects with
-- complete_tx); a row granted by lease_attempt with one keeps it.
-- With p_fair (semaphores), the group's free leases go to its live waiters
-- in their order first (the wait queue, wait_for): the call claims only
-- what is left over for it, behind the waiters ahead of p_waiter (all of
-- them without p_waiter), and a waiter that claims leaves the queue.
-- Without it (work queues), claims take what is free, and waiters are
-- woken oldest first, as many as items became free.
CREATE FUNCTION pgbaton.claim(p_group text, p_owner text, p_n integer, p_ttl_ms bigint, p_session bigint DEFAULT NULL,
    p_ref uuid DEFAULT NULL, p_retry boolean DEFAULT false, p_waiter text DEFAULT NULL, p_fair boolean DEFAULT false)
RETURNS TABLE (name text, token bigint, expires_at timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    t      timestamptz;
    picked text[];
    sid    bigint;
    base   bigint;
    epoch  bigint;
    grace  timestamptz;
    want   integer := p_n;
    ahead  integer;
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
        -- By grant_ref alone first (lease_grant_ref_idx): the planner,
        -- without statistics, would rather walk the group's held rows.
        RETURN QUERY
        WITH mine AS MATERIALIZED (
            SELECT l.* FROM pgbaton.lease l WHERE l.grant_ref = p_ref)
        SELECT l.name, l.token, l.expires_at FROM mine l
         WHERE l.session_id IS NOT DISTINCT FROM sid AND l.owner = p_owner AND l.lease_group = p_group
           AND pgbaton.lease_expiry(l.expires_at, pgbaton.session_expiry(l.session_id)) > t
         ORDER BY l.seq;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    -- Nothing is granted during a failover grace.
    SELECT g.epoch, g.grace_until INTO epoch, grace FROM pgbaton.grant_state() g;
    IF grace IS NOT NULL THEN
        RETURN;
    END IF;
    PERFORM pgbaton.requeue(p_group, p_waiter, true, sid, p_ttl_ms);
    IF p_fair THEN
        ahead := pgbaton.waiters_ahead(p_group, p_waiter);
        IF ahead > 0 THEN
            want := least(p_n, pgbaton.group_free(p_group, ahead + p_n) - ahead);
            IF want <= 0 THEN
                RETURN;
            END IF;
        END IF;
    END IF;
    -- The oldest n free rows, the oldest n expired rows without a session,
    -- and the oldest n of each dead session, each locked as it is found;
    -- the oldest n of all are granted. Rows locked but not granted stay as
    -- they were and are unlocked when this call's transaction ends. A dead
    -- session never comes back, so reading the sessions unlocked is safe.
    -- Whether a held row has expired is lease_expiry's to say; the other
    -- conditions are what the indexes serve (lease_free_idx, lease_held_idx
    -- by group and session, lease_session_floor_idx for the sessions that
    -- have ended), split so that each scan stays on its index.
    WITH free AS (
        SELECT l.name, l.seq FROM pgbaton.lease l
         WHERE l.lease_group = p_group AND l.owner IS NULL
         ORDER BY l.seq LIMIT want FOR UPDATE SKIP LOCKED
    ), expired AS (
        SELECT l.name, l.seq FROM pgbaton.lease l
         WHERE l.lease_group = p_group AND l.owner IS NOT NULL AND l.session_id IS NULL
           AND pgbaton.lease_free_at(l.expires_at, pgbaton.session_expiry(l.session_id), l.lock_delay_ms) <= t
         ORDER BY l.seq LIMIT want FOR UPDATE SKIP LOCKED
    ), dead AS (
        SELECT e.name, e.seq
          FROM pgbaton.lease_session s
         CROSS JOIN LATERAL (
            SELECT l.name, l.seq FROM pgbaton.lease l
             WHERE l.lease_group = p_group AND l.owner IS NOT NULL AND l.session_id = s.id
               AND pgbaton.lease_free_at(l.expires_at, s.expires_at, l.lock_delay_ms) <= t
             ORDER BY l.seq LIMIT want FOR UPDATE SKIP LOCKED) e
         WHERE s.expires_floor <= t AND s.expires_at <= t
    )
    SELECT array_agg(c.name ORDER BY c.seq) INTO picked
      FROM (SELECT a.name, a.seq
              FROM (SELECT * FROM free UNION ALL SELECT * FROM expired UNION ALL SELECT * FROM dead) a
             ORDER BY a.seq LIMIT want) c;
    IF picked IS NULL THEN
        RETURN;
    END IF;
    IF p_waiter IS NOT NULL THEN
        DELETE FROM pgbaton.lease_waiter w WHERE w.name = p_group AND w.waiter = p_waiter;
    END IF;
    -- The picked rows are free, expired without a session, or of dead
    -- sessions, never bound to the claimant's live one: closing it cannot
    -- be waiting for them.
    sid := pgbaton.session_hold(sid);
    PERFORM pgbaton.note_ttl(p_ttl_ms);
    base := pgbaton.token_base(epoch);
    t := clock_timestamp();
    -- The rows are locked by the selects above, so each token is drawn under
    -- its row's lock; the epoch is read once for all of them.
    RETURN QUERY
    WITH granted AS (
        UPDATE pgbaton.lease l
           SET owner = p_owner, token = pgbaton.token_draw(base), session_id = sid, grant_ref = p_ref,
               acquired_at = t, renewed_at = t, expires_at = t + p_ttl_ms * interval '1 millisecond',
               lock_delay_ms = 0
         WHERE l.name = ANY (picked)
        RETURNING l.name, l.token, l.expires_at, l.seq)
    SELECT g.name, g.token, g.expires_at FROM granted g ORDER BY g.seq;
END $$;

-- Elections: leasetable's Elect and Campaign hold a lease whose metadata
-- is {"value": what the leader publishes, "rank": its preference}; a lease
-- whose metadata has a rank is an election. Its candidates wait in the
-- lease's queue by rank (lease_waiter), its observers are registrations
-- with a NULL rank, and a request that its leader resign is a row of
-- lease_resign for the leader's term.

-- election_rank is the rank of an election's leader from the lease's
-- metadata, NULL when the lease is no election (or the rank no integer).
CREATE FUNCTION pgbaton.election_rank(p_metadata jsonb)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN jsonb_typeof(p_metadata->'rank') = 'number'
                 AND (p_metadata->>'rank')::numeric BETWEEN -2147483648 AND 2147483647
                THEN (p_metadata->>'rank')::numeric::integer END
$$;

-- A request that the leader of term token step down: the leader watching
-- for it (an observer of its own election) ends its term cleanly, and the
-- next candidate in the queue takes over. It concerns that term only: a
-- row whose token is not the election's current one is stale, and the next
-- request of the name replaces it.
CREATE TABLE pgbaton.lease_resign (
    name         text PRIMARY KEY,
    token        bigint NOT NULL,
    reason       text NOT NULL,
    requested_by text NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

COMMENT ON TABLE pgbaton.lease_resign IS
    'pgbaton: requests that the leader of an election (its term: token) resign';

-- notify_observers wakes the observers of p_name that listen (payload:
-- their waiter id, on the channel of notify_waiters). They read the
-- election again (pgbaton.leader) to learn what changed.
CREATE FUNCTION pgbaton.notify_observers(p_name text)
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
    PERFORM pg_notify('pgbaton_lease', w.waiter) FROM pgbaton.lease_waiter w
     WHERE w.name = p_name AND w.rank IS NULL AND w.listens AND pgbaton.waiter_alive(w.session_id, w.expires_at);
END $$;

-- request_resign asks the leader of election p_name to step down, for
-- p_reason, on behalf of p_by, and returns the term asked; NULL when
-- nobody leads it (or p_name is no election). The first request of a term
-- stands; later ones return the same term.
CREATE FUNCTION pgbaton.request_resign(p_name text, p_reason text, p_by text)
RETURNS bigint
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    t bigint;
BEGIN
    PERFORM pgbaton.lease_check_args(p_name, coalesce(nullif(p_by, ''), '-'), 1);
    IF p_reason IS NULL OR btrim(p_reason) = '' THEN
        RAISE EXCEPTION 'pgbaton: a request to resign needs a reason' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT l.token INTO t FROM pgbaton.lease l
     WHERE l.name = p_name AND l.metadata ? 'rank'
       AND pgbaton.lease_expiry(l.expires_at, pgbaton.session_expiry(l.session_id)) > clock_timestamp();
    IF t IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO pgbaton.lease_resign AS r (name, token, reason, requested_by)
    VALUES (p_name, t, p_reason, coalesce(p_by, ''))
    ON CONFLICT (name) DO UPDATE
       SET token = EXCLUDED.token, reason = EXCLUDED.reason, requested_by = EXCLUDED.requested_by,
           requested_at = EXCLUDED.requested_at
     WHERE r.token IS DISTINCT FROM EXCLUDED.token;
    IF FOUND THEN
        PERFORM pgbaton.notify_observers(p_name);
    END IF;
    RETURN t;
END $$;

-- leader is every election that has a leader now: its owner, the value it
-- published, its term (the lease token, larger for every new leader), its
-- rank, since when and until when it leads unless renewed, and a pending
-- request that it resign (what a leader reads when woken). Other languages observe an election by
-- registering as an observer (pgbaton.wait_for with p_rank NULL), LISTENing
-- on pgbaton_lease for their waiter id, and reading this view for the name
-- when woken; terms only grow.
CREATE VIEW pgbaton.leader AS
SELECT l.name, l.owner, l.metadata->>'value' AS value, l.token AS term, pgbaton.election_rank(l.metadata) AS rank,
       l.acquired_at AS since, pgbaton.lease_expiry(l.expires_at, pgbaton.session_expiry(l.session_id)) AS expires_at,
       r.reason AS resign_reason, r.requested_by AS resign_requested_by, r.requested_at AS resign_requested_at
  FROM pgbaton.lease l
  LEFT JOIN pgbaton.lease_resign r ON r.name = l.name AND r.token = l.token
 WHERE l.metadata ? 'rank'
   AND pgbaton.lease_expiry(l.expires_at, pgbaton.session_expiry(l.session_id)) > clock_timestamp();

COMMENT ON VIEW pgbaton.leader IS
    'pgbaton elections with a leader now: owner, value, term, rank, and a pending request to resign';

UPDATE pgbaton.schema_version SET version = 102;
