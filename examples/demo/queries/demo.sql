-- Queries of the demo (examples/demo; its tables are in demo_schema.sql).
-- Generated into examples/demo/internal/demodb.

-- name: DemoServer :one
SELECT current_setting('server_version')::text AS server_version,
       current_database()::text AS database;

-- name: DemoDropSchema :exec
DROP SCHEMA IF EXISTS pgbaton_demo CASCADE;

-- name: DemoCleanLeases :exec
DELETE FROM pgbaton.lease WHERE starts_with(name, 'demo:');

-- name: DemoCleanSlots :exec
DELETE FROM pgbaton.cron_slot WHERE starts_with(job, 'demo:');

-- name: DemoNow :one
SELECT clock_timestamp()::timestamptz AS now;

-- name: DemoRecordSlotRun :exec
INSERT INTO pgbaton_demo.slot_run (job, slot, worker) VALUES ($1, $2, $3);

-- name: DemoRecordProcessed :exec
-- Runs inside the item's fenced transaction, after the guard.
INSERT INTO pgbaton_demo.processed (item, worker, token, acquired_at)
SELECT l.name, sqlc.arg(worker)::int, l.token, l.acquired_at
  FROM pgbaton.lease l WHERE l.name = sqlc.arg(item)::text;

-- name: DemoRecordTerm :exec
INSERT INTO pgbaton_demo.leader_term (term, worker, acquired_at)
SELECT l.token, sqlc.arg(worker)::int, l.acquired_at
  FROM pgbaton.lease l WHERE l.name = sqlc.arg(name)::text AND l.token = sqlc.arg(term)::bigint;

-- name: DemoHeldBy :many
SELECT l.name FROM pgbaton.lease_status l
 WHERE l.owner = sqlc.arg(owner)::text AND l.held ORDER BY l.name;

-- name: DemoLeaseOf :one
SELECT coalesce(l.owner, '')::text AS owner, coalesce(l.token, 0)::bigint AS token
  FROM pgbaton.lease l WHERE l.name = $1;

-- name: DemoProcessedCount :one
SELECT count(*)::int AS rows, count(DISTINCT item)::int AS items FROM pgbaton_demo.processed;

-- name: DemoSlotStats :one
SELECT count(DISTINCT slot)::int AS slots, count(*)::int AS runs,
       coalesce(max(n), 0)::int AS max_runs_per_slot,
       count(DISTINCT worker)::int AS workers
  FROM (SELECT slot, worker, count(*) OVER (PARTITION BY slot) AS n FROM pgbaton_demo.slot_run) s;

-- name: DemoItemStats :one
SELECT count(*)::int AS rows, count(DISTINCT item)::int AS items,
       (SELECT count(*) FROM (SELECT item FROM pgbaton_demo.processed GROUP BY item HAVING count(*) > 1) d)::int AS doubled,
       count(DISTINCT worker)::int AS workers
  FROM pgbaton_demo.processed;

-- name: DemoTerms :many
SELECT term, worker, acquired_at FROM pgbaton_demo.leader_term ORDER BY at;

-- name: DemoLeftBy :many
-- Which of names the worker had not processed itself: a worker killed
-- just after an item's fenced transaction committed left it done.
SELECT n::text AS item
  FROM unnest(sqlc.arg(names)::text[]) n
 WHERE NOT EXISTS (SELECT 1 FROM pgbaton_demo.processed p
                    WHERE p.item = n AND p.worker = sqlc.arg(worker)::int)
 ORDER BY n;

-- name: DemoTakeover :one
-- The first grant, after since, of any of names to another worker: how long
-- a dead or paused holder's work stayed unowned.
SELECT coalesce(min(p.acquired_at), 'epoch')::timestamptz AS first_regrant
  FROM pgbaton_demo.processed p
 WHERE p.item = ANY(sqlc.arg(names)::text[]) AND p.worker <> sqlc.arg(worker)::int
   AND p.acquired_at > sqlc.arg(since)::timestamptz;

-- name: DemoTermAfter :one
SELECT coalesce(min(t.acquired_at), 'epoch')::timestamptz AS first_term
  FROM pgbaton_demo.leader_term t
 WHERE t.worker <> sqlc.arg(worker)::int AND t.acquired_at > sqlc.arg(since)::timestamptz;

-- name: DemoComplete :one
-- Completes an item lease inside the item's fenced transaction, guarded by
-- the lease's owner and token (pgbaton.complete).
SELECT pgbaton.complete(@name::text, @owner::text, @token::bigint)::boolean AS completed;
