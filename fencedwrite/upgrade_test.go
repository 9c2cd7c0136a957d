package fencedwrite_test

import (
	"testing"

	"github.com/golang-migrate/migrate/v4"
	pgxmigrate "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/migrations"
)

// fencingMigration is the migration that made a write carry a token.
const fencingMigration = 8

// Tables fenced before migration 0008 get its companion trigger when the
// database is migrated, partitioned ones included; migrating back down
// takes it away again.
func TestMigrationUpgradesFencedTables(t *testing.T) {
	ctx := testContext(t)
	pool := env.EmptyDB(t).Pool(t)
	_, err := pool.Exec(ctx, "CREATE SCHEMA pgbaton")
	require.NoError(t, err)
	src, err := iofs.New(migrations.FS(), ".")
	require.NoError(t, err)
	before, err := src.Prev(fencingMigration)
	require.NoError(t, err)
	sqlDB := stdlib.OpenDBFromPool(pool)
	driver, err := pgxmigrate.WithInstance(sqlDB, &pgxmigrate.Config{SchemaName: migrations.Schema, MigrationsTable: migrations.Table})
	require.NoError(t, err)
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = m.Close()
		_ = sqlDB.Close()
	})

	require.NoError(t, m.Migrate(before))
	_, err = pool.Exec(ctx, `
		CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, fence_token bigint);
		CREATE TABLE parted (id int, fence_token bigint) PARTITION BY RANGE (id);
		CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100);
		SELECT pgbaton.enable_fencing('accounts'), pgbaton.enable_fencing('parted');
		INSERT INTO accounts VALUES (1, 100, 7);
		INSERT INTO parted VALUES (1, 7);
		UPDATE accounts SET balance = 99 WHERE id = 1`) // no token: passed before
	require.NoError(t, err)
	triggers := func() (n int) {
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_trigger WHERE tgname = 'pgbaton_fence_token_set'").Scan(&n))
		return n
	}
	require.Zero(t, triggers())

	require.NoError(t, m.Migrate(fencingMigration))
	require.Equal(t, 3, triggers(), "accounts, parted and its partition (a clone)")
	_, err = pool.Exec(ctx, "UPDATE accounts SET balance = 1 WHERE id = 1")
	requireStale(t, fencedwrite.MapError(err), "public.accounts", 0, 7, fencedwrite.ReasonNoToken)
	_, err = pool.Exec(ctx, "UPDATE parted SET id = 2 WHERE id = 1")
	requireStale(t, fencedwrite.MapError(err), "public.parted_1", 0, 7, fencedwrite.ReasonNoToken)
	_, err = pool.Exec(ctx, "UPDATE accounts SET balance = 98, fence_token = 7 WHERE id = 1; UPDATE parted SET id = 2, fence_token = 7")
	require.NoError(t, err, "assigning the row's own token again presents it")

	require.NoError(t, m.Migrate(before))
	require.Zero(t, triggers())
	_, err = pool.Exec(ctx, "UPDATE accounts SET balance = 0, fence_token = 6 WHERE id = 1")
	require.Error(t, err, "still fenced the old way")
}
