-- Queries of the admin server (pgbaton serve): the database-side gauges read
-- at every /metrics scrape, and who the server is connected as. Each is one
-- pass over a small catalog view or over pgbaton.lease, so a scrape stays
-- cheap however often Prometheus comes.

-- name: AdminAdvisoryStats :one
-- Advisory locks in the current database: granted locks, waiting requests,
-- locks somebody waits for, and sessions holding at least one.
WITH l AS (
    SELECT pid, granted, classid, objid, objsubid
      FROM pg_catalog.pg_locks
     WHERE locktype = 'advisory'
       AND database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
)
SELECT count(*) FILTER (WHERE granted)::bigint AS held,
       count(*) FILTER (WHERE NOT granted)::bigint AS waiting,
       (SELECT count(*) FROM (SELECT DISTINCT classid, objid, objsubid FROM l WHERE NOT granted) c)::bigint AS contended,
       count(DISTINCT pid) FILTER (WHERE granted)::bigint AS sessions
  FROM l;

-- name: AdminLeaseTotals :one
-- Leases by state: held (expiry in the future), expired (an owner whose
-- expiry has passed and nobody has taken it over yet) and free.
SELECT count(*) FILTER (WHERE held)::bigint AS held,
       count(*) FILTER (WHERE owner IS NOT NULL AND NOT held)::bigint AS expired,
       count(*) FILTER (WHERE owner IS NULL)::bigint AS free,
       coalesce(max(token), 0)::bigint AS max_token
  FROM pgbaton.lease_status;

-- name: AdminLeaseGroups :many
-- Per lease group ('' for leases without one), the groups with the most
-- leases first, at most max_rows of them, so that the metric's label
-- cardinality stays bounded.
SELECT coalesce(lease_group, '')::text AS lease_group,
       count(*) FILTER (WHERE held)::bigint AS held,
       count(*) FILTER (WHERE owner IS NOT NULL AND NOT held)::bigint AS expired,
       coalesce(max(token), 0)::bigint AS max_token
  FROM pgbaton.lease_status
 GROUP BY lease_group
 ORDER BY count(*) DESC, lease_group
 LIMIT sqlc.arg(max_rows)::int;

-- name: AdminTopLeaseTokens :many
-- The leases with the highest fencing tokens, at most max_rows.
SELECT name, coalesce(lease_group, '')::text AS lease_group, token::bigint AS token
  FROM pgbaton.lease
 WHERE token IS NOT NULL
 ORDER BY token DESC
 LIMIT sqlc.arg(max_rows)::int;

-- name: AdminEventCounts :many
-- Audit log rows by action: forced releases and terminated holders.
SELECT action, count(*)::bigint AS events
  FROM pgbaton.event
 GROUP BY action
 ORDER BY action;

-- name: AdminIdentity :one
-- Who the server is connected as, and whether the database will let that
-- user force-release (the same test as pgbaton.require_admin).
SELECT current_user::text AS user_name,
       current_database()::text AS database,
       pg_is_in_recovery()::bool AS in_recovery,
       current_setting('server_version')::text AS server_version,
       (coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user), false)
        OR (EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = 'pgbaton_admin')
            AND pg_catalog.pg_has_role(current_user, 'pgbaton_admin', 'MEMBER')))::bool AS is_admin;
