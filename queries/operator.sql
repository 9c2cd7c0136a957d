-- name: AdvisoryLocks :many
-- Every advisory lock in the current database, held or awaited, with its
-- session. A bigint key is stored as classid (high 32 bits) and objid (low
-- 32 bits) with objsubid 1; an (int, int) pair as classid, objid with
-- objsubid 2. Both columns are unsigned oids: turn them back into signed
-- integers.
WITH locks AS (
    SELECT l.pid, l.mode, l.granted, l.objsubid::int AS objsubid,
           CASE WHEN l.objsubid = 1 THEN (l.classid::bigint << 32) | l.objid::bigint END AS key,
           CASE WHEN l.objsubid = 2 THEN (l.classid::bigint - CASE WHEN l.classid::bigint >= 2147483648 THEN 4294967296 ELSE 0 END)::int END AS key1,
           CASE WHEN l.objsubid = 2 THEN (l.objid::bigint - CASE WHEN l.objid::bigint >= 2147483648 THEN 4294967296 ELSE 0 END)::int END AS key2,
           l.classid, l.objid
      FROM pg_catalog.pg_locks l
     WHERE l.locktype = 'advisory'
       AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
)
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
 ORDER BY k.granted DESC, k.key, k.key1, k.key2, k.pid;

-- name: Leases :many
SELECT l.name, coalesce(l.lease_group, '')::text AS lease_group, coalesce(l.owner, '')::text AS owner,
       coalesce(l.token, 0)::bigint AS token, l.acquired_at, l.expires_at,
       (l.owner IS NOT NULL AND l.expires_at > clock_timestamp())::bool AS held,
       coalesce((extract(epoch FROM l.expires_at - clock_timestamp()) * 1000)::bigint, 0)::bigint AS expires_in_ms,
       coalesce((extract(epoch FROM clock_timestamp() - l.acquired_at) * 1000)::bigint, 0)::bigint AS held_for_ms,
       l.metadata
  FROM pgbaton.lease l
 WHERE starts_with(l.name, sqlc.arg(prefix)::text)
   AND (sqlc.arg(lease_group)::text = '' OR l.lease_group = sqlc.arg(lease_group)::text)
   AND (sqlc.arg(include_free)::bool OR (l.owner IS NOT NULL AND l.expires_at > clock_timestamp()))
 ORDER BY l.name
 LIMIT sqlc.arg(max_rows)::int;

-- name: JobRuns :many
SELECT r.id, r.job, r.owner, r.token, r.status, r.started_at, r.finished_at, r.heartbeat_at,
       coalesce(r.error, '')::text AS error,
       coalesce(r.checkpoint::text, '')::text AS checkpoint,
       coalesce((extract(epoch FROM coalesce(r.finished_at, clock_timestamp()) - r.started_at) * 1000)::bigint, 0)::bigint AS duration_ms
  FROM pgbaton.job_run r
 WHERE starts_with(r.job, sqlc.arg(prefix)::text)
   AND (sqlc.arg(status)::text = '' OR r.status = sqlc.arg(status)::text)
 ORDER BY r.id DESC
 LIMIT sqlc.arg(max_rows)::int;

-- name: Events :many
SELECT e.id, e.at, e.actor, e.action, e.target, e.reason, e.old_token, e.new_token, e.detail
  FROM pgbaton.event e
 ORDER BY e.id DESC
 LIMIT sqlc.arg(max_rows)::int;

-- name: ForceReleaseLease :one
SELECT f.old_owner::text AS old_owner, f.old_token::bigint AS old_token, f.new_token::bigint AS new_token
  FROM pgbaton.force_release_lease(sqlc.arg(name)::text, sqlc.arg(reason)::text) f;

-- name: TerminateAdvisoryHolder :one
SELECT t.terminated::bool AS terminated, t.locks_held::int AS locks_held
  FROM pgbaton.terminate_advisory_holder(sqlc.arg(pid)::int, sqlc.arg(target)::text, sqlc.arg(reason)::text) t;

