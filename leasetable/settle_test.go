package leasetable_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
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
	ctx := pgtest.Context(t, time.Minute)
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

// CompleteAndClaim with a context that has already ended sends nothing:
// its done leases are not completed, and must go back (after the next
// keep-alive) instead of staying bound to the client's live session until
// it ends.
func TestCompleteAndClaimWithEndedContextGivesDoneBack(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	const ttl = 10 * time.Second
	a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: ttl, RenewInterval: 200 * time.Millisecond})
	b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: ttl})
	_, err := a.Register(ctx, "cc", "item")
	require.NoError(t, err)
	done, err := a.Claim(ctx, "cc", 1)
	require.NoError(t, err)
	require.Len(t, done, 1)

	ended, cancel := context.WithCancel(ctx)
	cancel()
	_, err = a.CompleteAndClaim(ended, "cc", 1, done...)
	require.ErrorIs(t, err, context.Canceled)
	require.Error(t, done[0].Complete(ctx), "the item was not completed")

	start := time.Now()
	var got []*leasetable.Lease
	pgtest.Eventually(t, ttl/2, func() (bool, error) {
		got, err = b.Claim(ctx, "cc", 1)
		return len(got) == 1, err
	}, "the uncompleted item was not given back before half its TTL")
	t.Logf("claimable again after %s (TTL %s)", time.Since(start).Round(time.Millisecond), ttl)
	require.NoError(t, b.Complete(ctx, got...))
}
