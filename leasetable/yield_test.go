package leasetable_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// TestWaiterLooksDoNotOutgrowThePoolForTheKeepalive: a waiter that looks
// again while its client's own keep-alive is on the pool's one open
// connection made the pool open a second connection. In a fleet of 500
// clients (pools of 2) on 2 cores that was 405 of the 418 times a pool
// grew in 15 s: every client ended with two backends, the server started
// hundreds of backends while the fleet ran, and statements the server
// ran in 3 ms took 150 ms to return. A look now waits for the keep-alive
// on its way (bounded by the keep-alive's own deadline) when the pool has
// no idle connection.
//
// The keep-alive is held up by a transaction that locks the client's
// session row; the waiter polls every 10 ms meanwhile. The lease is freed
// while the keep-alive is held up, so a waiter that went ahead would get
// it on a second connection.
func TestWaiterLooksDoNotOutgrowThePoolForTheKeepalive(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	d := env.DB(t)
	admin := d.Pool(t)
	holder := newClient(t, admin, leasetable.Config{Owner: "holder"})
	held, err := holder.Acquire(ctx, "n")
	require.NoError(t, err)

	pool := d.Pool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 2 })
	waiter := newClient(t, pool, leasetable.Config{Owner: "waiter", TTL: 9 * time.Second, NoListen: true, PollInterval: 40 * time.Millisecond})
	res := goAcquire(func() (*leasetable.Lease, error) { return waiter.Acquire(ctx, "n") })
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease_queue WHERE name = 'n' AND owner = 'waiter'").Scan(&n)
		return n == 1, err
	}, "the waiter is not queued")
	require.Equal(t, int32(1), pool.Stat().TotalConns(), "the waiter's client opened a second connection before the test began")

	// Hold up the waiter's next keep-alive (every 3 s at this TTL).
	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.Background())
	_, err = tx.Exec(ctx, "SELECT FROM pgbaton.lease_session WHERE owner = 'waiter' FOR UPDATE")
	require.NoError(t, err)
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%session_keepalive%'`).Scan(&n)
		return n == 1, err
	}, "the keep-alive is not held up")

	// The lease is free now; the waiter, at the head of its queue, looks
	// every 10 ms. It may take it only on the connection the keep-alive
	// holds: for 100 of its looks, it has not, and the pool has not grown.
	require.NoError(t, held.Release(ctx))
	deadline := time.Now().Add(100 * 10 * time.Millisecond)
	for time.Now().Before(deadline) {
		select {
		case r := <-res:
			t.Fatalf("the waiter got the lease while its keep-alive held the pool's one connection: %v, %v; pool: %d connections",
				r.l, r.err, pool.Stat().TotalConns())
		case <-time.After(10 * time.Millisecond):
		}
		require.Equal(t, int32(1), pool.Stat().TotalConns(), "the pool opened a connection for a look while the keep-alive held the other")
	}

	require.NoError(t, tx.Rollback(ctx))
	var r acquired
	select {
	case r = <-res:
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter did not get the lease within 30 s of the keep-alive's return")
	}
	require.NoError(t, r.err)
	require.NoError(t, r.l.Release(ctx))
	require.Equal(t, int64(1), pool.Stat().NewConnsCount(), fmt.Sprintf("%+v", pool.Stat()))
}
