package main

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
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
