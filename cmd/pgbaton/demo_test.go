package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The demo is the product's end-to-end check: four worker processes, a
// SIGKILL and a SIGSTOP, and every invariant verified in the database.
func TestDemoInvariantsHold(t *testing.T) {
	d := env.DB(t)
	code, out, errOut := cli(t, "demo", "--dsn", d.URL)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	require.NotContains(t, out, "FAILED")
	for _, want := range []string{"SIGKILL worker", "SIGSTOP worker", "REJECTED by the fence", "items processed exactly once", "demo finished"} {
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
	code, _, errOut := cli(t, "demo", "--workers", "1")
	require.Equal(t, exitUsage, code, errOut)
}
