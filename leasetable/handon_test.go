package leasetable_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// A waiter that leaves the head of a queue while a release's wake-up is
// on its way hands its turn on, whichever of the two commits first: the
// wake-up either goes to the next waiter, or to the leaving one and then
// its removal wakes the next. Before, a removal still uncommitted when
// the wake-up read the queue (a client's deferred stop_waiting, in flight
// on its LISTEN connection) and a wake-up that had not seen the release
// yet when the removal looked lost the turn: the next waiter slept until
// its next look (a TTL away), though the item was free.
func TestLeavingWaiterHandsOnAReleaseInFlight(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	listen := listenConn(t, ctx, pool)

	_, err := pool.Exec(ctx, "SELECT pgbaton.register('g', ARRAY['i1'])")
	require.NoError(t, err)
	var token int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT token FROM pgbaton.claim('g', 'holder', 1, 600000)").Scan(&token))
	for _, w := range []string{"x/1", "y/1"} {
		_, err := pool.Exec(ctx, "SELECT pgbaton.wait_for('g', $1, true)", w)
		require.NoError(t, err)
	}

	// x leaves, uncommitted.
	leave, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = leave.Rollback(ctx) }()
	_, err = leave.Exec(ctx, "SELECT pgbaton.stop_waiting('g', 'x/1')")
	require.NoError(t, err)

	// The holder releases and wakes the waiters, as a client does.
	var waiters bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT waiters FROM pgbaton.release('i1', 'holder', $1)", token).Scan(&waiters))
	require.True(t, waiters)
	woke := make(chan error, 1)
	go func() {
		_, err := pool.Exec(ctx, "SELECT pgbaton.notify_waiters(ARRAY['i1'])")
		woke <- err
	}()
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		select {
		case err := <-woke:
			woke <- err
			return true, nil
		default:
		}
		// Or it waits for the leaving waiter's transaction.
		return pgtest.Count(t, pool, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%notify_waiters%'") == 1, nil
	}, "the wake-up neither ended nor waited")
	require.NoError(t, leave.Commit(ctx))
	require.NoError(t, <-woke)

	for {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := listen.WaitForNotification(wctx)
		cancel()
		require.NoError(t, err, "y was never woken: the free item's turn was lost")
		if n.Payload == "y/1" {
			return
		}
	}
}
