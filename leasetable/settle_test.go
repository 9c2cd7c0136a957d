package leasetable_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/leasetable"
)

// pgbaton.settle_many learns how completions in callers' transactions
// ended and gives back the leases whose transaction rolled back. Each
// lease must be released with its own token: here the first of two is
// gone (its transaction committed) and the second rolled back, so the
// second must be 'released', not 'busy' for ever.
func TestSettleManyReleasesEachWithItsToken(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := ctxT(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "settle", TTL: time.Minute})
	_, err := c.Register(ctx, "settle", "a", "b")
	require.NoError(t, err)
	ls, err := c.Claim(ctx, "settle", 2)
	require.NoError(t, err)
	require.Len(t, ls, 2)
	byName := map[string]*leasetable.Lease{}
	for _, l := range ls {
		byName[l.Name()] = l
	}
	a, b := byName["a"], byName["b"]
	require.NotNil(t, a)
	require.NotNil(t, b)
	// a's completion committed: its row is gone.
	_, err = pool.Exec(ctx, "DELETE FROM pgbaton.lease WHERE name = 'a'")
	require.NoError(t, err)

	rows, err := pool.Query(ctx, "SELECT name, state FROM pgbaton.settle_many($1, $2, 'settle')",
		[]string{"a", "b"}, []int64{a.Token(), b.Token()})
	require.NoError(t, err)
	states := map[string]string{}
	for rows.Next() {
		var n, s string
		require.NoError(t, rows.Scan(&n, &s))
		states[n] = s
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]string{"a": "gone", "b": "released"}, states)
	var owner *string
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT owner FROM pgbaton.lease WHERE name = 'b'").Scan(&owner))
	require.Nil(t, owner, "b is free again")
}
