package leasetable_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// TestCloseGivesBackGrantsWhoseCallerGaveUp: a grant that landed after its
// caller gave up, whose give-back by request id failed, waits in the
// keeper's queue; Close gives it back, so the lease is free the moment
// Close returns, not a TTL later. ReleaseTimeout 1ns makes every
// give-back outside Close fail (Close sends on the caller's context).
func TestCloseGivesBackGrantsWhoseCallerGaveUp(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pool := env.DB(t).Pool(t)
	other := newClient(t, pool, leasetable.Config{Owner: "other"})
	l, err := other.TryAcquire(ctx, "x")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))

	c, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "gave-up", ReleaseTimeout: time.Nanosecond})
	require.NoError(t, err)

	// The row is locked, so the grant waits; the caller gives up first.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM pgbaton.lease WHERE name = 'x' FOR UPDATE")
	require.NoError(t, err)
	waiting := func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%lease_attempt%'").Scan(&n))
		return n > 0
	}
	short, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.TryAcquire(short, "x")
		done <- err
	}()
	require.Eventually(t, waiting, 10*time.Second, 5*time.Millisecond, "the grant never waited for the row")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.NoError(t, tx.Commit(ctx))

	// The grant lands for nobody, and its give-back fails: the lease stays
	// held by the client's session, which its keep-alives keep alive.
	owner := func() string {
		var o *string
		err := pool.QueryRow(ctx, "SELECT owner FROM pgbaton.lease_status WHERE name = 'x' AND held").Scan(&o)
		if errors.Is(err, pgx.ErrNoRows) || o == nil {
			return ""
		}
		require.NoError(t, err)
		return *o
	}
	require.Eventually(t, func() bool { return owner() == "gave-up" }, 10*time.Second, 5*time.Millisecond, "the abandoned grant never landed")

	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	require.NoError(t, c.Close(cctx))
	assert.Empty(t, owner(), "the abandoned grant is still held after Close")
}

// TestKeeperDropsEndedLeasesAsItGoes: a worker that claims and completes
// thousands of items between two keep-alives leaves the keeper holding
// about what is live, not every lease granted since the last keep-alive.
// The keeper dropped ended leases only at a keep-alive (every TTL/3), so
// at 80k items/s its map grew to ~400k entries that every claim added to
// and the garbage collector scanned (claim batch 100, 80 runs: 3.82 s of
// client CPU, 3.33 s once dropped as it goes).
func TestKeeperDropsEndedLeasesAsItGoes(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pool := env.DB(t).Pool(t)
	// A TTL no keep-alive falls inside of while the test runs.
	c := newClient(t, pool, leasetable.Config{Owner: "worker", TTL: time.Hour})
	const items, batch = 5000, 100
	names := make([]string, items)
	for i := range names {
		names[i] = fmt.Sprintf("item-%04d", i)
	}
	_, err := c.Register(ctx, "q", names...)
	require.NoError(t, err)
	ls, err := c.Claim(ctx, "q", batch)
	most, done := 0, 0
	for err == nil && len(ls) > 0 {
		done += len(ls)
		most = max(most, leasetable.KeeperHeld(c))
		ls, err = c.CompleteAndClaim(ctx, "q", batch, ls...)
	}
	require.NoError(t, err)
	require.Equal(t, items, done)
	require.LessOrEqual(t, most, 4*batch+leasetable.KeeperPruneMin,
		"the keeper kept %d leases for %d live", most, batch)
}
