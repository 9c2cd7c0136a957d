-- name: SchemaVersion :one
SELECT version FROM pgbaton.schema_version;

-- name: SchemaMigrations :one
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

-- name: ReplicationInfo :one
-- The physical standbys streaming from this server (not logical
-- subscribers, not base backups in progress), how many of them are
-- synchronous, and the settings that decide whether a commit waits for
-- them. sync_state is NULL for roles without pg_read_all_stats:
-- unknown_state counts those rows.
SELECT count(*)::int AS standbys,
       count(*) FILTER (WHERE r.sync_state IN ('sync', 'quorum'))::int AS sync_standbys,
       count(*) FILTER (WHERE r.sync_state IS NULL)::int AS unknown_state,
       current_setting('synchronous_standby_names')::text AS synchronous_standby_names,
       current_setting('synchronous_commit')::text AS synchronous_commit
  FROM pg_catalog.pg_stat_replication r
 WHERE r.state IS DISTINCT FROM 'backup'
   AND r.pid NOT IN (SELECT s.active_pid FROM pg_catalog.pg_replication_slots s
                      WHERE s.slot_type = 'logical' AND s.active_pid IS NOT NULL);
