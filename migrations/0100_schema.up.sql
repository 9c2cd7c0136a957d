-- The pgbaton schema. migrations.Up creates it before golang-migrate runs,
-- because the migration bookkeeping table pgbaton.schema_migrations lives in
-- it; IF NOT EXISTS keeps this file valid when run on its own (sqlc, psql).
CREATE SCHEMA IF NOT EXISTS pgbaton;

COMMENT ON SCHEMA pgbaton IS 'pgbaton: distributed locks, leases and fenced writes (github.com/pgbaton/pgbaton)';
