-- The pgbaton schema. migrations.Up creates it before golang-migrate runs,
-- because the migration bookkeeping table pgbaton.schema_migrations lives in
-- it; IF NOT EXISTS keeps this file valid when run on its own (sqlc, psql).
CREATE SCHEMA IF NOT EXISTS pgbaton;

COMMENT ON SCHEMA pgbaton IS 'pgbaton: distributed locks, leases and fenced writes (github.com/pgbaton/pgbaton)';

-- The schema's version, kept by the migration files themselves, so that it
-- is right whichever tool applied them (migrations.Up, golang-migrate in
-- your own pipeline, goose, tern, Atlas, dbmate, psql --single-transaction):
-- every file sets it as its last statement, and every down file sets it
-- back. The library refuses a database whose version is not the one it was
-- built for (pgbaton.ErrNotMigrated, pgbaton.ErrSchemaTooNew).
CREATE TABLE pgbaton.schema_version (
    version integer NOT NULL,
    single boolean PRIMARY KEY DEFAULT true CHECK (single)
);

COMMENT ON TABLE pgbaton.schema_version IS
    'pgbaton: the version of this schema (the number of the last migration file applied); one row';

INSERT INTO pgbaton.schema_version (version) VALUES (100);
