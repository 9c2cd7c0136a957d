-- The operator's view of the database, shared by the admin page and
-- pgbaton's CLI (which imports this module): locks, leases, waiters, runs
-- and events, and forced releases. Generated into admin/admindb.

-- name: LockTableUsage :one
-- The shared lock table holds max_locks_per_transaction * (MaxBackends +
-- max_prepared_transactions) entries for the whole server; advisory locks
-- count against it, and when it is full even new logins fail (53200).
SELECT (SELECT count(*) FROM pg_catalog.pg_locks WHERE NOT fastpath)::bigint AS used,
       (SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory')::bigint AS advisory,
       (current_setting('max_locks_per_transaction')::bigint
        * (current_setting('max_connections')::bigint
           + current_setting('autovacuum_max_workers')::bigint + 1
           + current_setting('max_worker_processes')::bigint
           + current_setting('max_wal_senders')::bigint
           + current_setting('max_prepared_transactions')::bigint))::bigint AS capacity;

-- name: AdvisoryLocks :many
-- Advisory locks in the current database, held or awaited, with their
-- sessions, filtered and paged: prefix matches the registered name, holder
-- the application name (substring, any case) or the backend pid, state is
-- '' (all), 'held', 'waiting' (requests not granted) or 'contended'
-- (waiting requests and the locks they wait for). A bigint key is stored as
-- classid (high 32 bits) and objid (low 32 bits) with objsubid 1; an (int,
-- int) pair as classid, objid with objsubid 2. Both columns are unsigned
-- oids: turn them back into signed integers.
WITH locks AS (
    SELECT l.pid, l.mode, l.granted, l.objsubid::int AS objsubid,
           CASE WHEN l.objsubid = 1 THEN (l.classid::bigint << 32) | l.objid::bigint END AS key,
           CASE WHEN l.objsubid = 2 THEN (l.classid::bigint - CASE WHEN l.classid::bigint >= 2147483648 THEN 4294967296 ELSE 0 END)::int END AS key1,
           CASE WHEN l.objsubid = 2 THEN (l.objid::bigint - CASE WHEN l.objid::bigint >= 2147483648 THEN 4294967296 ELSE 0 END)::int END AS key2,
           l.classid, l.objid
      FROM pg_catalog.pg_locks l
     WHERE l.locktype = 'advisory'
       AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
), rows AS (
    SELECT k.pid::int AS pid, k.mode::text AS mode, k.granted::bool AS granted, k.objsubid,
           coalesce(k.key, 0)::bigint AS key, coalesce(k.key1, 0)::int AS key1, coalesce(k.key2, 0)::int AS key2,
           coalesce(n.name, '')::text AS name, coalesce(n.namespace, '')::text AS namespace,
           coalesce(a.application_name, '')::text AS application_name,
           coalesce(host(a.client_addr), '')::text AS client_addr,
           a.backend_start,
           coalesce(a.state, '')::text AS state,
           (SELECT count(*) FROM locks w
             WHERE NOT w.granted AND w.classid = k.classid AND w.objid = k.objid AND w.objsubid = k.objsubid)::int AS waiters,
           coalesce(pg_catalog.pg_blocking_pids(k.pid), '{}')::int[] AS blocked_by
      FROM locks k
      LEFT JOIN pgbaton.advisory_name n ON k.objsubid = 1 AND n.key = k.key
      LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = k.pid
)
SELECT r.pid, r.mode, r.granted, r.objsubid, r.key, r.key1, r.key2, r.name, r.namespace,
       r.application_name, r.client_addr, r.backend_start, r.state, r.waiters, r.blocked_by
  FROM rows r
 WHERE (sqlc.arg(prefix)::text = '' OR starts_with(r.name, sqlc.arg(prefix)::text))
   AND (sqlc.arg(holder)::text = ''
        OR strpos(lower(r.application_name), lower(sqlc.arg(holder)::text)) > 0
        OR r.pid::text = sqlc.arg(holder)::text)
   AND CASE sqlc.arg(lock_state)::text
         WHEN 'held' THEN r.granted
         WHEN 'waiting' THEN NOT r.granted
         WHEN 'contended' THEN NOT r.granted OR r.waiters > 0
         ELSE true
       END
 ORDER BY r.granted DESC, r.key, r.key1, r.key2, r.pid
 LIMIT sqlc.arg(max_rows)::int OFFSET sqlc.arg(skip_rows)::int;

-- name: Leases :many
-- Leases by name after the name `after` (keyset paging: '' for the first
-- page), filtered: prefix on the name, the group, holder as a substring of
-- the owner (any case), and state 'held', 'expired' (an owner whose expiry
-- has passed and nobody took it over yet), 'lock-delay' (an owner that
-- lost its grant, whose lock-delay holds the name back until
-- lock_delay_until), 'free' (no owner) or 'all'. 'expired' includes
-- 'lock-delay'.
SELECT l.name, coalesce(l.lease_group, '')::text AS lease_group, coalesce(l.owner, '')::text AS owner,
       coalesce(l.token, 0)::bigint AS token, l.acquired_at, l.expires_at,
       l.held::bool AS held,
       (CASE WHEN l.held THEN 'held' WHEN l.lock_delay_until IS NOT NULL THEN 'lock-delay'
             WHEN l.owner IS NOT NULL THEN 'expired' ELSE 'free' END)::text AS lease_state,
       l.lock_delay_until,
       coalesce((extract(epoch FROM l.expires_at - clock_timestamp()) * 1000)::bigint, 0)::bigint AS expires_in_ms,
       coalesce((extract(epoch FROM clock_timestamp() - l.acquired_at) * 1000)::bigint, 0)::bigint AS held_for_ms,
       l.metadata
  FROM pgbaton.lease_status l
 WHERE starts_with(l.name, sqlc.arg(prefix)::text)
   AND l.name > sqlc.arg(after)::text
   AND (sqlc.arg(lease_group)::text = '' OR l.lease_group = sqlc.arg(lease_group)::text)
   AND (sqlc.arg(holder)::text = '' OR strpos(lower(coalesce(l.owner, '')), lower(sqlc.arg(holder)::text)) > 0)
   AND CASE sqlc.arg(lease_state)::text
         WHEN 'held' THEN l.held
         WHEN 'expired' THEN l.owner IS NOT NULL AND NOT l.held
         WHEN 'lock-delay' THEN l.lock_delay_until IS NOT NULL
         WHEN 'free' THEN l.owner IS NULL
         ELSE true
       END
 ORDER BY l.name
 LIMIT sqlc.arg(max_rows)::int;

-- name: LeaseWaiters :many
-- The wait queue (pgbaton.lease_queue): callers waiting in leasetable's
-- Acquire (or a semaphore) for a lease, or for any lease of a group
-- (is_group), in the order they are served: position 1 is next. Only live
-- waiters: one whose process died leaves when its lease session expires.
-- Ordered by name, then position; holder matches the owner or the waiter
-- id (substring, any case). pgbaton.lease_waiter is UNLOGGED: a standby cannot
-- read it (0A000).
SELECT q.name::text AS name, q.is_group::bool AS is_group, q.position::bigint AS position,
       q.waiter::text AS waiter, coalesce(q.owner, '')::text AS owner, q.since::timestamptz AS since,
       (extract(epoch FROM q.waited) * 1000)::bigint AS waiting_ms
  FROM pgbaton.lease_queue q
 WHERE starts_with(q.name, sqlc.arg(prefix)::text)
   AND (sqlc.arg(holder)::text = ''
        OR strpos(lower(q.waiter), lower(sqlc.arg(holder)::text)) > 0
        OR strpos(lower(coalesce(q.owner, '')), lower(sqlc.arg(holder)::text)) > 0)
 ORDER BY q.name, q.position
 LIMIT sqlc.arg(max_rows)::int;

-- name: Elections :many
-- The leasetable elections that have a leader (pgbaton.leader), by name:
-- the leader, what it published, its term and rank, and a pending request
-- that it resign. holder matches the leader (substring, any case).
SELECT v.name::text AS name, v.owner::text AS owner, coalesce(v.value, '')::text AS value, v.term::bigint AS term,
       coalesce(v.rank, 0)::int AS rank, v.since::timestamptz AS since,
       coalesce(v.resign_reason, '')::text AS resign_reason, coalesce(v.resign_requested_by, '')::text AS resign_requested_by
  FROM pgbaton.leader v
 WHERE starts_with(v.name, sqlc.arg(prefix)::text)
   AND (sqlc.arg(holder)::text = '' OR strpos(lower(v.owner), lower(sqlc.arg(holder)::text)) > 0)
 ORDER BY v.name
 LIMIT sqlc.arg(max_rows)::int;

-- name: JobRuns :many
-- Job runs newest first, before the id `before` (keyset paging: 0 for the
-- first page).
SELECT r.id, r.job, r.owner, r.token, r.status, r.started_at, r.finished_at, r.heartbeat_at,
       coalesce(r.error, '')::text AS error,
       coalesce(r.checkpoint::text, '')::text AS checkpoint,
       coalesce((extract(epoch FROM coalesce(r.finished_at, clock_timestamp()) - r.started_at) * 1000)::bigint, 0)::bigint AS duration_ms
  FROM pgbaton.job_run r
 WHERE starts_with(r.job, sqlc.arg(prefix)::text)
   AND (sqlc.arg(status)::text = '' OR r.status = sqlc.arg(status)::text)
   AND (sqlc.arg(before)::bigint = 0 OR r.id < sqlc.arg(before)::bigint)
 ORDER BY r.id DESC
 LIMIT sqlc.arg(max_rows)::int;

-- name: Events :many
-- The audit log newest first, before the id `before` (0: from the newest).
SELECT e.id, e.at, e.actor, e.action, e.target, e.reason, e.old_token, e.new_token, e.detail
  FROM pgbaton.event e
 WHERE (sqlc.arg(before)::bigint = 0 OR e.id < sqlc.arg(before)::bigint)
 ORDER BY e.id DESC
 LIMIT sqlc.arg(max_rows)::int;

-- name: ForceReleaseLease :one
-- clear_delay frees a grant with a lock-delay at once (and ends the
-- lock-delay of one lost before); free_at says when the name can be
-- granted again: now, or when the lock-delay kept ends.
SELECT f.old_owner::text AS old_owner, f.old_token::bigint AS old_token, f.new_token::bigint AS new_token,
       coalesce(f.lock_delay_until, clock_timestamp())::timestamptz AS free_at
  FROM pgbaton.force_release_lease(sqlc.arg(name)::text, sqlc.arg(reason)::text, sqlc.arg(clear_delay)::bool) f;

-- name: TerminateAdvisoryHolder :one
SELECT t.terminated::bool AS terminated, t.locks_held::int AS locks_held
  FROM pgbaton.terminate_advisory_holder(sqlc.arg(pid)::int, sqlc.arg(target)::text, sqlc.arg(reason)::text) t;

-- name: FailoverGrace :one
-- The failover grace (pgbaton.failover_grace): after a timeline change a
-- new primary grants nothing until the longest TTL in use has passed.
SELECT g.enabled::boolean AS enabled, g.active::boolean AS active, g.grace_until, g.started_at,
       g.from_timeline, g.to_timeline, g.ttl_in_use_ms::bigint AS ttl_in_use_ms,
       CASE WHEN g.active THEN greatest(extract(epoch FROM g.grace_until - g.db_now), 0) ELSE 0 END::float8 AS remaining_seconds
  FROM pgbaton.failover_grace() g;

-- name: RequestLeaderResign :one
-- Asks the leader of an election to resign and writes the audit row
-- (pgbaton.request_leader_resign). The CLI's resign shares it.
SELECT r.leader::text AS leader, r.term::bigint AS term
  FROM pgbaton.request_leader_resign(sqlc.arg(name)::text, sqlc.arg(reason)::text) r;
