DROP TABLE pgbaton.schema_version;

-- The schema itself holds pgbaton.schema_migrations, which golang-migrate
-- still writes after this file runs; migrations.Down drops the schema once
-- every migration is down.
COMMENT ON SCHEMA pgbaton IS NULL;
