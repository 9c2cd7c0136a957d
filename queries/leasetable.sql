-- Wrappers for the lease protocol functions (migrations/0102_leasetable). The
-- functions hold the logic, so psql and other languages behave the same.

-- name: LeaseAttempt :one
SELECT a.acquired::boolean AS acquired, a.token::bigint AS token,
       a.expires_at::timestamptz AS expires_at, coalesce(a.holder, '')::text AS holder,
       a.db_now::timestamptz AS db_now, a.grace_until, coalesce(a.ahead, 0)::integer AS ahead, a.lock_delay_until
  FROM pgbaton.lease_attempt(@name::text, @owner::text, @ttl_ms::bigint, sqlc.narg(metadata)::jsonb, sqlc.narg(session)::bigint, sqlc.narg(ref)::uuid,
                             sqlc.narg(waiter)::text, @lock_delay_ms::bigint, @rank::integer, NOT @polls::boolean) a;

-- name: LeaseAttemptAll :many
-- Every name of a set or none (pgbaton.lease_attempt_all): a row per name
-- granted, in byte order, then a row for the name refused if one was;
-- with keep_prefix the names granted before it are kept.
SELECT a.name::text AS name, a.acquired::boolean AS acquired, a.token::bigint AS token,
       a.expires_at::timestamptz AS expires_at, coalesce(a.holder, '')::text AS holder,
       a.db_now::timestamptz AS db_now, (a.grace_until IS NOT NULL)::boolean AS grace, coalesce(a.ahead, 0)::integer AS ahead,
       (a.lock_delay_until IS NOT NULL)::boolean AS lock_delay
  FROM pgbaton.lease_attempt_all(@names::text[], @owner::text, @ttl_ms::bigint, sqlc.narg(session)::bigint, sqlc.narg(ref)::uuid,
                                 @keep_prefix::boolean, @lock_delay_ms::bigint) a;

-- name: LeaseRenew :one
SELECT r.expires_at::timestamptz AS expires_at
  FROM pgbaton.renew(@name::text, @owner::text, @token::bigint, @ttl_ms::bigint) r;

-- name: LeaseRelease :one
SELECT r.released::boolean AS released, r.waiters::boolean AS waiters
  FROM pgbaton.release(@name::text, @owner::text, @token::bigint) r;

-- name: LeaseNotifyWaiters :exec
-- Wakes the waiters of leases released (and of their groups), after the
-- release committed: see pgbaton.notify_waiters.
SELECT pgbaton.notify_waiters(@names::text[]);

-- name: LeaseWaitFor :exec
-- Joins the wait queue of a lease or group, bound to the client's lease
-- session: as a candidate of that rank, or as an observer (rank NULL).
SELECT pgbaton.wait_for(@name::text, @waiter::text, @is_group::boolean, sqlc.narg(session)::bigint, @ttl_ms::bigint, @listens::boolean,
                        sqlc.narg(rank)::integer, @drain::boolean);

-- name: LeaseStopWaiting :exec
SELECT pgbaton.stop_waiting(@name::text, @waiter::text);

-- name: LeaseStopWaitingAll :exec
-- Removes every registration of a closing client (waiter ids start with
-- its owner and a slash), each handing its turn on (stop_waiting).
SELECT pgbaton.stop_waiting(w.name, w.waiter) FROM pgbaton.lease_waiter w WHERE starts_with(w.waiter, @owner::text || '/');

-- name: LeaseRegister :one
SELECT pgbaton.register(@lease_group::text, @names::text[])::integer AS created;

-- name: LeaseClaim :many
SELECT c.name::text AS name, c.token::bigint AS token, c.expires_at::timestamptz AS expires_at
  FROM pgbaton.claim(@lease_group::text, @owner::text, @n::integer, @ttl_ms::bigint, sqlc.narg(session)::bigint,
                     sqlc.narg(ref)::uuid, @retry::boolean, sqlc.narg(waiter)::text, @fair::boolean) c;

-- name: LeaseGet :one
SELECT l.name, l.lease_group, l.owner, l.token, l.acquired_at,
       (l.expires_at IS NOT NULL)::boolean AS has_expiry,
       coalesce(pgbaton.lease_expiry(l.expires_at, pgbaton.session_expiry(l.session_id)), clock_timestamp())::timestamptz AS expires_at,
       l.metadata,
       clock_timestamp()::timestamptz AS db_now
  FROM pgbaton.lease l WHERE l.name = @name::text;

-- name: LeaseGroupCount :one
SELECT count(*)::integer AS n FROM pgbaton.lease WHERE lease_group = @lease_group::text;

-- name: LeaseGroupCounts :one
SELECT c.free::integer AS free, c.held::integer AS held, c.expired::integer AS expired
  FROM pgbaton.group_counts(@lease_group::text) c;

-- name: LeaseGroupDrained :one
SELECT pgbaton.group_drained(@lease_group::text)::boolean AS drained;

-- name: LeaseGroupNextExpiry :one
-- When the first live lease of a group held by someone else expires
-- (NULL when there is none), and when a failover grace in force ends
-- (NULL when none is), for waiters on a full group. Leases already
-- expired are left out: one still locked by an open transaction (a
-- completion in it) cannot be claimed until that ends, and waiting for
-- its past expiry would be no wait at all.
SELECT n.expires_at AS next_expiry, g.grace_until, clock_timestamp()::timestamptz AS db_now
  FROM pgbaton.grant_state() g
  LEFT JOIN LATERAL (SELECT s.expires_at FROM pgbaton.lease_status s
                      WHERE s.lease_group = @lease_group::text AND s.held AND s.owner <> @owner::text
                      ORDER BY s.expires_at LIMIT 1) n ON true;

-- name: SyncEpoch :exec
-- Stores the epoch of a new timeline and starts its failover grace, in a
-- statement of its own: a client refused a grant by a grace that has not
-- started yet starts it.
SELECT pgbaton.sync_epoch();

-- name: FailoverGrace :one
-- The failover grace, for status pages and metrics.
SELECT g.enabled::boolean AS enabled, g.active::boolean AS active, g.grace_until, g.started_at,
       g.from_timeline, g.to_timeline, g.ttl_in_use_ms::bigint AS ttl_in_use_ms, g.db_now::timestamptz AS db_now
  FROM pgbaton.failover_grace() g;

-- name: LeaseListen :exec
-- pgbaton.notify_waiters notifies this channel with a released lease's name.
LISTEN pgbaton_lease;

-- name: LeaseListenStart :one
-- Takes one of @slots listen slots and LISTENs; false (and not listening)
-- when every slot is taken: the client's waiters poll.
SELECT pgbaton.listen_start(@slots::integer)::boolean AS listening;

-- name: LeaseListenSlotFree :one
-- Whether one of @slots listen slots is free, asked on the pool before a
-- LISTEN connection is opened.
SELECT pgbaton.listen_slot_free(@slots::integer)::boolean AS free;

-- name: LeaseUnlisten :exec
-- Nobody waits for a while: the client stops listening (and so stops being
-- signalled for every release) but keeps its slot.
UNLISTEN pgbaton_lease;

-- name: LeaseListenStop :exec
-- The client has no waiters: it stops listening and frees its slot.
SELECT pgbaton.listen_stop();

-- name: LeaseCompleteMany :many
-- Deletes the rows of finished work items in one round trip, each guarded
-- by its (name, token) like pgbaton.complete; returns the names deleted.
SELECT name::text FROM pgbaton.complete_many(@names::text[], @tokens::bigint[], @owner::text) AS name;

-- name: LeaseNotify :exec
-- Client.Check sends its own payload on the release channel and waits for
-- its LISTEN connection to deliver it. A payload nobody waits for wakes
-- nobody.
SELECT pg_notify('pgbaton_lease', @payload::text);

-- name: LeaseReleaseMany :many
-- Gives back leases of one owner in one round trip, each guarded by its
-- (name, token) like pgbaton.release; returns the names freed and
-- whether anyone waits for each. lost names the grants given back because
-- they were lost: those with a lock-delay keep it (pgbaton.release_many).
SELECT r.name::text AS name, r.waiters::boolean AS waiters
  FROM pgbaton.release_many(@names::text[], @tokens::bigint[], @owner::text, @lost::text[]) r;

-- name: LeaseCompleteTx :exec
-- Completes leases inside the caller's transaction; raises PB001, aborting
-- it, if any of them is no longer held with its token.
SELECT pgbaton.complete_tx(@names::text[], @tokens::bigint[], @owner::text);

-- name: LeaseStillHeld :many
-- Which of the given grants of an owner are still in the table, for the
-- error of a failed complete_tx.
SELECT name::text FROM pgbaton.held_grants(@names::text[], @tokens::bigint[], @owner::text) AS name;

-- name: SessionOpen :one
-- Starts the lease session a client keeps all its leases alive with.
SELECT s.id::bigint AS id, s.expires_at::timestamptz AS expires_at, s.epoch::bigint AS epoch
  FROM pgbaton.session_open(@owner::text, @ttl_ms::bigint) s;

-- name: SessionKeepalive :one
-- The session's new expiry and revoked counter while it lives (alive); once
-- it has expired it is never revived, and alive is false. server_now is the
-- database's clock after the keep-alive either way: the client compares
-- how far it moved with its own monotonic clock, to notice a step of it.
SELECT (k.expires_at IS NOT NULL)::boolean AS alive,
       coalesce(k.expires_at, clock_timestamp())::timestamptz AS expires_at,
       coalesce(k.revoked, 0)::bigint AS revoked,
       coalesce(k.epoch, 0)::bigint AS epoch,
       clock_timestamp()::timestamptz AS server_now
  FROM (VALUES (1)) AS one (x)
  LEFT JOIN LATERAL pgbaton.session_keepalive(@id::bigint, @ttl_ms::bigint) k ON true;

-- name: SessionClose :exec
SELECT pgbaton.session_close(@id::bigint);

-- name: SessionLost :many
-- Which of a session's grants are no longer held by it (force-released).
SELECT name::text FROM pgbaton.session_lost(@session::bigint, @names::text[], @tokens::bigint[], @owner::text) AS name;

-- name: LeaseSettleMany :many
-- How completions inside callers' transactions (complete_tx) ended:
-- 'gone', 'released' or 'busy' per name.
SELECT s.name::text AS name, s.state::text AS state
  FROM pgbaton.settle_many(@names::text[], @tokens::bigint[], @owner::text) s;

-- name: LeaseReleaseRef :many
-- Gives back what request ref granted in a session, tokens unknown.
SELECT name::text FROM pgbaton.release_ref(@owner::text, @session::bigint, @ref::uuid) AS name;

-- name: Prune :one
-- One batch of a table's retention rule; returns how many rows went.
SELECT pgbaton.prune(@table_name::text, @older_than::interval, @batch::integer)::integer AS deleted;

-- name: LeaseRequestResign :one
-- Asks the leader of an election to resign, and returns its term; 0 when
-- nobody leads it (tokens are positive).
SELECT coalesce(pgbaton.request_resign(@name::text, @reason::text, @requested_by::text), 0)::bigint AS term;

-- name: LeaseResignRequest :many
-- The request that the leader of one term resign, if any.
SELECT v.resign_reason::text AS reason, v.resign_requested_by::text AS requested_by
  FROM pgbaton.leader v
 WHERE v.name = @name::text AND v.term = @token::bigint AND v.resign_reason IS NOT NULL;
