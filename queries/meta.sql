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
