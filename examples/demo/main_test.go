package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/examples/demo/internal/demodb"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/migrations"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	// The demo starts its workers as `<this executable> worker ...`; under
	// go test that executable is the test binary, so act as the demo.
	if len(os.Args) > 1 && os.Args[1] == workerArg {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	env = pgtest.Setup(pgtest.Options{})
	os.Exit(env.Run(m))
}

// runDemoCmd runs the demo in-process and returns exit code, stdout and
// stderr.
func runDemoCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// The demo is the product's end-to-end check: four worker processes, a
// SIGKILL and a SIGSTOP, and every invariant verified in the database.
func TestDemoInvariantsHold(t *testing.T) {
	d := env.DB(t)
	code, out, errOut := runDemoCmd(t, "-dsn", d.URL)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	require.NotContains(t, out, "FAILED")
	for _, want := range []string{"pgbaton schema version", "SIGKILL worker", "SIGSTOP worker", "REJECTED by the fence", "items processed exactly once", "demo finished"} {
		require.Contains(t, out, want)
	}
	// Nothing of the demo is left behind.
	conn, err := pgx.Connect(context.Background(), d.URL)
	require.NoError(t, err)
	var n int
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM pgbaton.lease WHERE starts_with(name, 'demo:'))
		      + (SELECT count(*) FROM pg_namespace WHERE nspname = 'pgbaton_demo')`).Scan(&n))
	require.Zero(t, n)
	require.NoError(t, conn.Close(context.Background()))
	env.NoConnections(t, d)
}

func TestDemoBadInput(t *testing.T) {
	for _, args := range [][]string{
		{"-workers", "1"},
		{"-items", "x"},
		{"-timeout", "-1s"},
		{"extra"},
		{workerArg, "-id", "x"},
	} {
		code, _, errOut := runDemoCmd(t, args...)
		require.Equal(t, exitUsage, code, "%q: %s", args, errOut)
	}
}

// A stale write against an item completed meanwhile says so, rather than
// "current token 0, unknown lease".
func TestDemoExplainsStaleWrites(t *testing.T) {
	require.Equal(t, "no such lease: demo:item:7 was completed meanwhile, or never granted",
		staleWhy(demoEvent{Item: "demo:item:7", Token: 12, Detail: "no such lease"}))
	require.Equal(t, "current token 124, superseded",
		staleWhy(demoEvent{Item: "demo:item:7", Token: 12, Current: 124, Detail: "superseded"}))
}

// A worker SIGKILLed just after the fenced transaction of an item it held
// committed left that item done, not to take over: the summary must not
// count it as a takeover that never came (CI printed "killed worker's 1
// items taken over after -498818h34m6.8s FAILED" for one).
func TestDemoKilledWorkersFinishedItemNeedsNoTakeover(t *testing.T) {
	d := env.DB(t)
	ctx := context.Background()
	pool := d.Pool(t)
	require.NoError(t, migrations.Up(ctx, pool))
	for _, tc := range []struct {
		name   string
		killed []string // worker 1 processed item 0; worker 2 took item 1 over
		want   string
	}{
		{"all done", []string{"demo:item:0000"}, "killed worker's items left to take over"},
		{"one left", []string{"demo:item:0000", "demo:item:0001"}, "killed worker's 1 items taken over after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			r := &demoRun{stdout: &out, pool: pool, q: demodb.New(), start: time.Now()}
			require.NoError(t, r.setup(ctx, demoOpts{items: 2}))
			t.Cleanup(func() { _ = r.q.DemoDropSchema(ctx, pool); _ = r.q.DemoCleanLeases(ctx, pool) })
			_, err := pool.Exec(ctx, `INSERT INTO pgbaton_demo.processed (item, worker, token, acquired_at) VALUES
				('demo:item:0000', 1, 1, clock_timestamp() - interval '1 second')`)
			require.NoError(t, err)
			killedAt, err := r.q.DemoNow(ctx, pool)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `INSERT INTO pgbaton_demo.processed (item, worker, token, acquired_at) VALUES
				('demo:item:0001', 2, 2, clock_timestamp() + interval '1 second')`)
			require.NoError(t, err)
			sc := &scenarioResult{killed: 1, killedAt: killedAt, killedItems: tc.killed}
			_ = r.summary(ctx, sc, 2) // other checks fail: no scenario ran
			line := ""
			for _, l := range strings.Split(out.String(), "\n") {
				if strings.HasPrefix(l, "killed worker's") {
					line = l
				}
			}
			require.Contains(t, line, tc.want, out.String())
			require.True(t, strings.HasSuffix(strings.TrimSpace(line), " ok"), line)
		})
	}
}
