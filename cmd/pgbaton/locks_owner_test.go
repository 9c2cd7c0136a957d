package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/advisory"
)

// `pgbaton locks` shows which process holds an advisory lock taken
// through a Locker: its connections carry "pgbaton advisory <owner>".
func TestLocksShowLockerOwner(t *testing.T) {
	ctx := context.Background()
	d := env.DB(t)
	l, err := advisory.New(d.Pool(t), advisory.Config{Owner: "worker-3:4242"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	lk, err := l.TryLock(ctx, advisory.Name("job:owned"))
	require.NoError(t, err)
	defer lk.Unlock(ctx)

	code, out, errOut := cli(t, "locks", "--dsn", d.URL, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var rep locksReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Len(t, rep.Advisory, 1)
	require.Equal(t, "job:owned", rep.Advisory[0].Lock)
	require.Equal(t, "pgbaton advisory worker-3:4242", rep.Advisory[0].ApplicationName)

	code, out, errOut = cli(t, "locks", "--dsn", d.URL)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "pgbaton advisory worker-3:4242")
}
