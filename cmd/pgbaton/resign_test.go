package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestResignAsksTheLeaderAndIsAudited(t *testing.T) {
	ctx := context.Background()
	d := env.DB(t)
	pool := d.Pool(t)
	// An election as leasetable's Elect makes it: the metadata's rank
	// marks it.
	var term int64
	require.NoError(t, pool.QueryRow(ctx,
		`SELECT token FROM pgbaton.lease_attempt('scheduler', 'worker-1', 600000, '{"value": "10.0.0.7", "rank": 0}')`).Scan(&term))

	code, _, errOut := cli(t, "resign", "scheduler", "--dsn", d.URL)
	require.Equal(t, exitUsage, code, "no reason")
	require.Contains(t, errOut, "--reason is required")

	code, out, errOut := cli(t, "resign", "scheduler", "--dsn", d.URL, "--reason", "drain node-3", "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var res struct {
		Leader string `json:"leader"`
		Term   int64  `json:"term,string"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, "worker-1", res.Leader)
	require.Equal(t, term, res.Term)

	var reason, by string
	require.NoError(t, pool.QueryRow(ctx, `SELECT resign_reason, resign_requested_by FROM pgbaton.leader WHERE name = 'scheduler'`).Scan(&reason, &by))
	require.Equal(t, "drain node-3", reason)
	require.Equal(t, "postgres", by)

	code, out, errOut = cli(t, "events", "--dsn", d.URL, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var events []eventView
	require.NoError(t, json.Unmarshal([]byte(out), &events))
	require.Len(t, events, 1)
	require.Equal(t, "request_resign", events[0].Action)
	require.Equal(t, "scheduler", events[0].Target)
	require.Equal(t, "drain node-3", events[0].Reason)
	require.Equal(t, term, *events[0].OldToken)

	code, out, errOut = cli(t, "events", "--dsn", d.URL)
	require.Equal(t, exitOK, code, errOut)
	t.Log(out)

	// A lease that is no election, and an election nobody leads.
	_, err := pool.Exec(ctx, `SELECT pgbaton.try_acquire('plain', 'worker-2', 600000)`)
	require.NoError(t, err)
	code, _, errOut = cli(t, "resign", "plain", "--dsn", d.URL, "--reason", "x")
	require.Equal(t, exitNotFound, code, errOut)
	require.Contains(t, errOut, "has no leader")
	_, err = pool.Exec(ctx, `SELECT pgbaton.release('scheduler', 'worker-1', $1)`, term)
	require.NoError(t, err)
	code, _, errOut = cli(t, "resign", "scheduler", "--dsn", d.URL, "--reason", "x")
	require.Equal(t, exitNotFound, code, errOut)
}
