-- name: SchemaVersion :one
SELECT version, dirty FROM pgbaton.schema_migrations LIMIT 1;

-- name: ServerInfo :one
SELECT current_setting('server_version')::text AS server_version,
       current_setting('server_version_num')::int AS server_version_num,
       pg_is_in_recovery() AS in_recovery,
       current_database()::text AS database,
       current_user::text AS current_user_name;

-- name: LockMigrations :exec
-- Serialises migrations.Up and Down between processes, for the duration of
-- the caller's transaction.
SELECT pg_advisory_xact_lock(hashtextextended('pgbaton:migrations', 0));

-- name: LockMigrationsSession :exec
-- Held for a whole Up or Down, so that no run sees another's half-done
-- (dirty) state.
SELECT pg_advisory_lock(hashtextextended('pgbaton:migrations', 0));

-- name: UnlockMigrationsSession :exec
SELECT pg_advisory_unlock(hashtextextended('pgbaton:migrations', 0));

-- name: CreateSchema :exec
-- golang-migrate keeps its bookkeeping table in the schema, so the schema
-- must exist before the first migration runs.
CREATE SCHEMA IF NOT EXISTS pgbaton;

-- name: DropSchema :exec
-- After every migration is down. RESTRICT: never drop objects a user put
-- into the schema.
DROP SCHEMA pgbaton RESTRICT;

-- name: DropSchemaMigrations :exec
DROP TABLE IF EXISTS pgbaton.schema_migrations;

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
