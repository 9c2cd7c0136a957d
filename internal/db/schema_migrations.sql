-- For sqlc only: golang-migrate creates this bookkeeping table itself
-- (migrations.Up), so it is not in migrations/.
CREATE TABLE pgbaton.schema_migrations (
    version bigint NOT NULL PRIMARY KEY,
    dirty boolean NOT NULL
);
