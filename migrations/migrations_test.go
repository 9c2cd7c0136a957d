package migrations_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // pgx5://
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/schema"
	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/migrations"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{Children: map[string]pgtest.ChildFunc{
		"up": func(ctx context.Context, args []string) error {
			return migrations.UpURL(ctx, args[0])
		},
	}})
	os.Exit(env.Run(m))
}

var update = flag.Bool("update", false, "rewrite testdata/catalog.golden from the migrated schema")

// catalog describes every object in the schema pgbaton (testdata/catalog.sql:
// catalog queries only, so it runs on every server major without pg_dump).
func catalog(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	query, err := os.ReadFile("testdata/catalog.sql")
	require.NoError(t, err)
	rows, err := pool.Query(context.Background(), string(query))
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(lines, "\n") + "\n"
}

// TestCatalogSnapshot: the migrated schema is exactly the committed
// snapshot, so a change to any function, table, index, trigger or grant
// shows in review as a change to testdata/catalog.golden.
func TestCatalogSnapshot(t *testing.T) {
	got := catalog(t, env.DB(t).Pool(t))
	const golden = "testdata/catalog.golden"
	if *update {
		require.NoError(t, os.WriteFile(golden, []byte(got), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	require.Equal(t, string(want), got, "the schema differs from %s: if the change is meant, add a migration and run `go test ./migrations -run TestCatalogSnapshot -update`", golden)
}

// TestPreReleaseSchemaIsRefused: a database a development build migrated
// before the baseline (versions 1-16 then) is refused by Check and by Up,
// with an error that says what to do, and Up changes nothing.
func TestPreReleaseSchemaIsRefused(t *testing.T) {
	ctx := context.Background()
	db := env.DB(t)
	pool := db.Pool(t)
	// A pre-release build kept no record of its own, only golang-migrate's.
	_, err := pool.Exec(ctx, "DROP TABLE pgbaton.schema_version; UPDATE pgbaton.schema_migrations SET version = 16")
	require.NoError(t, err)
	before := catalog(t, pool)
	for name, err := range map[string]error{
		"Check": migrations.Check(ctx, pool),
		"Up":    migrations.Up(ctx, pool),
		"Down":  migrations.Down(ctx, pool),
	} {
		require.ErrorIs(t, err, migrations.ErrPreRelease, name)
		require.ErrorIs(t, err, pgbaton.ErrNotMigrated, name)
		require.Contains(t, err.Error(), "DROP SCHEMA pgbaton CASCADE", name)
	}
	v, dirty, err := migrations.Version(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, uint(16), v, "the version is left alone")
	require.False(t, dirty)
	require.Equal(t, before, catalog(t, pool), "the schema is left alone")
}

func TestUpDownUpGivesTheSameSchema(t *testing.T) {
	ctx := context.Background()
	db := env.EmptyDB(t)
	pool := db.Pool(t)

	v, dirty, err := migrations.Version(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, v)
	require.False(t, dirty)
	require.ErrorIs(t, migrations.Check(ctx, pool), pgbaton.ErrNotMigrated)

	require.NoError(t, migrations.Up(ctx, pool))
	first := catalog(t, pool)
	require.Contains(t, first, "function pgbaton.claim(")
	v, dirty, err = migrations.Version(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
	require.False(t, dirty)
	require.NoError(t, migrations.Check(ctx, pool))
	require.NoError(t, migrations.Up(ctx, pool), "Up again is a no-op")

	require.NoError(t, migrations.Down(ctx, pool))
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgbaton'").Scan(&n))
	require.Zero(t, n, "Down removes the schema")

	require.NoError(t, migrations.Up(ctx, pool))
	require.Equal(t, first, catalog(t, pool))
}

func TestDownKeepsForeignObjects(t *testing.T) {
	ctx := context.Background()
	db := env.EmptyDB(t)
	pool := db.Pool(t)
	require.NoError(t, migrations.Up(ctx, pool))
	_, err := pool.Exec(ctx, "CREATE TABLE pgbaton.users_own_table (id int)")
	require.NoError(t, err)
	err = migrations.Down(ctx, pool)
	require.Error(t, err)
	require.Contains(t, err.Error(), "did not create")
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.users_own_table").Scan(new(int)))
}

func TestConcurrentUpFromTwoProcesses(t *testing.T) {
	ctx := context.Background()
	db := env.EmptyDB(t)
	a := env.StartChild(t, "up", db.URL)
	b := env.StartChild(t, "up", db.URL)
	require.NoError(t, a.Wait(t, time.Minute), a.Stderr())
	require.NoError(t, b.Wait(t, time.Minute), b.Stderr())
	pool := db.Pool(t)
	require.NoError(t, migrations.Check(ctx, pool))
}

func TestUpRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	db := env.DB(t)
	pool := db.Pool(t)
	_, err := pool.Exec(ctx, "UPDATE pgbaton.schema_migrations SET version = $1", migrations.Latest()+1)
	require.NoError(t, err)
	err = migrations.Up(ctx, pool)
	require.ErrorIs(t, err, pgbaton.ErrSchemaTooNew)
	require.Contains(t, err.Error(), "upgrade pgbaton")
	require.ErrorIs(t, migrations.Check(ctx, pool), pgbaton.ErrSchemaTooNew)
}

func TestDirtyIsReported(t *testing.T) {
	ctx := context.Background()
	db := env.DB(t)
	pool := db.Pool(t)
	_, err := pool.Exec(ctx, "UPDATE pgbaton.schema_migrations SET dirty = true")
	require.NoError(t, err)
	require.ErrorIs(t, migrations.Up(ctx, pool), migrations.ErrDirty)
	require.ErrorIs(t, migrations.Check(ctx, pool), migrations.ErrDirty)
}

func TestBadInput(t *testing.T) {
	ctx := context.Background()
	require.ErrorIs(t, migrations.Up(ctx, nil), pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, migrations.Down(ctx, nil), pgbaton.ErrInvalidArgument)
	_, _, err := migrations.Version(ctx, nil)
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, migrations.UpURL(ctx, "::not a url::"), pgbaton.ErrInvalidArgument)
}

func TestStandbyIsRefused(t *testing.T) {
	// A real standby: a base backup of a primary started with standby.signal.
	primary := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true})
	standby := pgtest.NewStandby(t, primary)
	err := migrations.UpURL(context.Background(), standby.URL("postgres"))
	require.ErrorIs(t, err, pgbaton.ErrStandby)
}

// The library checks the schema version against a generated constant
// instead of these embedded files (so that it never links golang-migrate);
// the two must agree. When this fails, run `make generate`.
func TestLatestIsTheLibrarysLatest(t *testing.T) {
	require.Equal(t, migrations.Latest(), schema.Latest, "internal/schema/latest.go is stale: run `make generate`")
}

// TestNoFunctionIsReplannedAtEveryCall: Postgres (before 18) keeps no plan
// of a LANGUAGE sql function it cannot inline, and one with a SET clause,
// SECURITY DEFINER or a body that is not a SELECT is never inlined: every
// call parses and plans its body again. complete_many was such a function
// (with leasetable's TestStatementsArePlannedOnce, the other half of a
// one-item CompleteAndClaim going from 390 to 219 µs). The functions
// pgbaton calls are plpgsql (plans cached per session) or inlinable SQL.
func TestNoFunctionIsReplannedAtEveryCall(t *testing.T) {
	ctx := context.Background()
	pool := env.DB(t).Pool(t)
	rows, err := pool.Query(ctx, `
		SELECT p.oid::regprocedure::text FROM pg_proc p
		  JOIN pg_language lang ON lang.oid = p.prolang
		 WHERE p.pronamespace = 'pgbaton'::regnamespace AND lang.lanname = 'sql'
		   AND (p.proconfig IS NOT NULL OR p.prosecdef OR btrim(p.prosrc, E' \n\t') !~* '^select')
		 ORDER BY 1`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, names, "LANGUAGE sql functions Postgres cannot inline, so plans at every call: make them plpgsql")
}

// TestScalarSQLFunctionsInline: a LANGUAGE sql function that reads like
// one Postgres inlines may still not be: IMMUTABLE with a body that is
// only STABLE (timestamptz + interval depends on TimeZone), a body with a
// sub-SELECT, a STRICT function whose body is not. Then every transaction
// that calls it from plpgsql parses and plans its body again:
// lease_free_at, IMMUTABLE over such a sum and called twice by every
// grant, cost a try-acquire + release cycle a fifth of its throughput
// (pgbench, one client, fsync off, 4 alternating pairs of 3 s). Each
// scalar one is called here on a table's columns, which the planner cannot
// fold, and must not be left in the plan.
func TestScalarSQLFunctionsInline(t *testing.T) {
	ctx := context.Background()
	pool := env.DB(t).Pool(t)
	rows, err := pool.Query(ctx, `
		SELECT p.proname, coalesce(string_agg(format_type(a.t, NULL), ',' ORDER BY a.n), '')
		  FROM pg_proc p
		  JOIN pg_language lang ON lang.oid = p.prolang
		  LEFT JOIN LATERAL unnest(p.proargtypes::oid[]) WITH ORDINALITY a(t, n) ON true
		 WHERE p.pronamespace = 'pgbaton'::regnamespace AND lang.lanname = 'sql' AND p.prokind = 'f'
		   AND NOT p.proretset AND p.prorettype <> 'record'::regtype
		 GROUP BY p.oid, p.proname ORDER BY p.proname`)
	require.NoError(t, err)
	type fn struct{ name, types string }
	fns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fn, error) {
		var f fn
		return f, r.Scan(&f.name, &f.types)
	})
	require.NoError(t, err)
	require.NotEmpty(t, fns)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var left []string
	for _, f := range fns {
		var cols, args []string
		for i, typ := range strings.Split(f.types, ",") {
			if typ == "" {
				break
			}
			cols = append(cols, fmt.Sprintf("a%d %s", i, typ))
			args = append(args, fmt.Sprintf("x.a%d", i))
		}
		_, err := conn.Exec(ctx, fmt.Sprintf("CREATE TEMP TABLE inline_args (%s)", strings.Join(cols, ", ")))
		require.NoError(t, err)
		rows, err := conn.Query(ctx, fmt.Sprintf("EXPLAIN (VERBOSE) SELECT pgbaton.%s(%s) FROM pg_temp.inline_args x", f.name, strings.Join(args, ", ")))
		require.NoError(t, err)
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		// advisory_key stays IMMUTABLE over the STABLE convert_to: the
		// name registry's CHECK calls it, and a CHECK takes only
		// IMMUTABLE functions. It runs once per name registered, and a
		// call on constants (pg_advisory_lock(advisory_key('job'))) is
		// folded when the statement is planned.
		if f.name != "advisory_key" && strings.Contains(strings.Join(plan, "\n"), "pgbaton."+f.name+"(") {
			left = append(left, f.name)
		}
		_, err = conn.Exec(ctx, "DROP TABLE pg_temp.inline_args")
		require.NoError(t, err)
	}
	require.Empty(t, left, "LANGUAGE sql functions left in their callers' plans: fix what stops Postgres inlining them, or make them plpgsql")
}

// ownTool applies pgbaton's files with golang-migrate as a service's own
// pipeline would: its bookkeeping in a table of its own, outside pgbaton's
// schema.
func ownTool(t *testing.T, url string) *migrate.Migrate {
	t.Helper()
	src, err := iofs.New(pgbaton.Migrations(), ".")
	require.NoError(t, err)
	m, err := migrate.NewWithSourceInstance("iofs", src, strings.Replace(url, "postgres://", "pgx5://", 1)+"&x-migrations-table=app_migrations")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = m.Close() })
	return m
}

// TestEveryFileRecordsTheVersion: after each file up, and each file down,
// the schema's own record says the version golang-migrate says, so a tool
// that keeps its bookkeeping elsewhere leaves a database the library
// accepts.
func TestEveryFileRecordsTheVersion(t *testing.T) {
	ctx := context.Background()
	db := env.EmptyDB(t)
	pool := db.Pool(t)
	m := ownTool(t, db.URL)
	own := func() uint {
		var v uint
		require.NoError(t, pool.QueryRow(ctx, "SELECT version FROM pgbaton.schema_version").Scan(&v))
		return v
	}
	steps := 0
	for {
		err := m.Steps(1)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		require.NoError(t, err)
		steps++
		v, dirty, err := m.Version()
		require.NoError(t, err)
		require.False(t, dirty)
		require.Equal(t, v, own(), "after file %d up", v)
	}
	require.Equal(t, migrations.Latest(), own())
	require.Greater(t, steps, 1)
	require.NoError(t, migrations.Check(ctx, pool), "the library accepts it")
	for range steps - 1 {
		require.NoError(t, m.Steps(-1))
		v, _, err := m.Version()
		require.NoError(t, err)
		require.Equal(t, v, own(), "after the file above %d down", v)
	}
}

// TestUpTakesOverAnotherToolsSchema: migrations.Up on a database whose
// schema another tool installed picks up from its version instead of
// applying the files again, and Down removes it.
func TestUpTakesOverAnotherToolsSchema(t *testing.T) {
	ctx := context.Background()
	db := env.EmptyDB(t)
	pool := db.Pool(t)
	require.NoError(t, ownTool(t, db.URL).Up())
	v, dirty, err := migrations.Version(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
	require.False(t, dirty)
	require.NoError(t, migrations.Up(ctx, pool))
	require.NoError(t, migrations.Check(ctx, pool))
	require.NoError(t, migrations.Down(ctx, pool))
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgbaton'").Scan(&n))
	require.Zero(t, n, "Down removes the schema")
}
