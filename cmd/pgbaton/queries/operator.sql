-- Queries only the operator's CLI (cmd/pgbaton) runs: the server's status.
-- Locks, leases, runs, events and forced releases are the admin module's
-- (admin/queries, shared with the admin page). Generated into
-- cmd/pgbaton/internal/opdb.

-- name: ServerStatus :one
SELECT current_setting('server_version')::text AS server_version,
       pg_is_in_recovery() AS in_recovery,
       current_database()::text AS database,
       current_user::text AS current_user_name;

-- name: BackendPID :one
-- Told apart per connection, to see a transaction pooler.
SELECT pg_backend_pid()::int AS pid;

-- name: CompleteNames :many
-- Shell completion: lease names (of a group, when given) and registered
-- advisory lock names starting with prefix.
SELECT n.name::text AS name FROM (
    SELECT l.name FROM pgbaton.lease l
     WHERE starts_with(l.name, sqlc.arg(prefix)::text)
       AND (sqlc.arg(lease_group)::text = '' OR l.lease_group = sqlc.arg(lease_group)::text)
    UNION
    SELECT a.name FROM pgbaton.advisory_name a
     WHERE sqlc.arg(lease_group)::text = '' AND starts_with(a.name, sqlc.arg(prefix)::text)
) n
 ORDER BY n.name
 LIMIT sqlc.arg(max_rows)::int;

-- name: CompleteGroups :many
-- Shell completion: lease groups starting with prefix.
SELECT DISTINCT l.lease_group::text AS lease_group
  FROM pgbaton.lease l
 WHERE l.lease_group IS NOT NULL AND starts_with(l.lease_group, sqlc.arg(prefix)::text)
 ORDER BY 1
 LIMIT sqlc.arg(max_rows)::int;
