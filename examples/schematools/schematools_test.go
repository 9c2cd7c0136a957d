package schematools_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // pgx5://
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for goose
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/examples/schematools"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/migrations"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{})
	os.Exit(env.Run(m))
}

// tools install the whole schema on an empty database, each as a
// service's own migration step would, and take it down again.
var tools = []struct {
	name       string
	up, down   func(t *testing.T, ctx context.Context, url string)
	leftBehind string // the tool's bookkeeping, outside pgbaton's schema
}{
	{"golang-migrate", func(t *testing.T, ctx context.Context, url string) {
		require.NoError(t, golangMigrate(t, url).Up())
	}, func(t *testing.T, ctx context.Context, url string) {
		require.NoError(t, golangMigrate(t, url).Down())
	}, "app_pgbaton_migrations"},
	{"goose", func(t *testing.T, ctx context.Context, url string) {
		_, err := gooseProvider(t, url).Up(ctx)
		require.NoError(t, err)
	}, func(t *testing.T, ctx context.Context, url string) {
		_, err := gooseProvider(t, url).DownTo(ctx, 0)
		require.NoError(t, err)
	}, "goose_pgbaton"},
	{"tern", func(t *testing.T, ctx context.Context, url string) {
		require.NoError(t, ternMigrator(t, ctx, url).Migrate(ctx))
	}, func(t *testing.T, ctx context.Context, url string) {
		require.NoError(t, ternMigrator(t, ctx, url).MigrateTo(ctx, 0))
	}, "tern_pgbaton"},
}

func golangMigrate(t *testing.T, url string) *migrate.Migrate {
	src, err := iofs.New(pgbaton.Migrations(), ".")
	require.NoError(t, err)
	m, err := migrate.NewWithSourceInstance("iofs", src,
		strings.Replace(url, "postgres://", "pgx5://", 1)+"&x-migrations-table=app_pgbaton_migrations")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = m.Close() })
	return m
}

func gooseProvider(t *testing.T, url string) *goose.Provider {
	ms, err := schematools.GooseMigrations()
	require.NoError(t, err)
	db, err := goose.OpenDBWithDriver("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, nil,
		goose.WithGoMigrations(ms...), goose.WithTableName("goose_pgbaton"))
	require.NoError(t, err)
	return p
}

func ternMigrator(t *testing.T, ctx context.Context, url string) interface {
	Migrate(context.Context) error
	MigrateTo(context.Context, int32) error
} {
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	m, err := schematools.TernMigrator(ctx, conn, "tern_pgbaton")
	require.NoError(t, err)
	return m
}

// TestEachToolInstallsASchemaTheLibraryUses: after each tool's up, the
// library accepts the database and its three layers work on it; after its
// down, nothing of pgbaton's is left but the empty schema and the tool's
// own bookkeeping.
func TestEachToolInstallsASchemaTheLibraryUses(t *testing.T) {
	for _, tool := range tools {
		t.Run(tool.name, func(t *testing.T) {
			ctx := pgtest.Context(t, time.Minute)
			d := env.EmptyDB(t)
			pool := d.Pool(t)
			tool.up(t, ctx, d.URL)

			v, dirty, err := migrations.Version(ctx, pool)
			require.NoError(t, err)
			require.Equal(t, migrations.Latest(), v)
			require.False(t, dirty)

			c, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "w1", TTL: 10 * time.Second})
			require.NoError(t, err, "the library accepts the schema")
			l, err := c.TryAcquire(ctx, "nightly")
			require.NoError(t, err)
			_, err = c.TryAcquire(ctx, "nightly")
			require.ErrorIs(t, err, leasetable.ErrHeld)
			_, err = pool.Exec(ctx, "CREATE TABLE ledger (entry text)")
			require.NoError(t, err)
			require.NoError(t, fencedwrite.InTx(ctx, pool, l, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO ledger VALUES ('paid')")
				return err
			}))
			require.NoError(t, l.Release(ctx))
			var stale *fencedwrite.StaleTokenError
			require.ErrorAs(t, fencedwrite.InTx(ctx, pool, l, func(pgx.Tx) error { return nil }), &stale, "a released lease writes nothing")
			require.NoError(t, c.Close(ctx))

			locker, err := advisory.New(pool, advisory.Config{})
			require.NoError(t, err)
			lk, err := locker.TryLock(ctx, advisory.Name("nightly"))
			require.NoError(t, err)
			require.NoError(t, lk.Unlock(ctx))
			require.NoError(t, locker.Close(ctx))

			tool.down(t, ctx, d.URL)
			var objects int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'pgbaton'`).Scan(&objects))
			require.Zero(t, objects, "down removed every table of pgbaton's")
			require.ErrorIs(t, migrations.Check(ctx, pool), pgbaton.ErrNotMigrated)
			var kept bool
			require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, tool.leftBehind).Scan(&kept))
			require.True(t, kept, "the tool keeps its bookkeeping where it chose")
		})
	}
}
