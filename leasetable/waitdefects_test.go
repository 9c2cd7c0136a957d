package leasetable_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// otherHolds registers item in group and claims it for owner "other"
// through the SQL protocol (no session), for ttl, returning its token.
func otherHolds(t *testing.T, ctx context.Context, pool *pgxpool.Pool, group, item string, ttl time.Duration) int64 {
	t.Helper()
	_, err := pool.Exec(ctx, "SELECT pgbaton.register($1, ARRAY[$2])", group, item)
	require.NoError(t, err)
	var token int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT token FROM pgbaton.claim($1, 'other', 1, $2)", group, ttl.Milliseconds()).Scan(&token))
	return token
}

// completingTx opens a transaction that completes other's item (row
// deleted and locked until it ends), and rolls it back at the test's end.
func completingTx(t *testing.T, ctx context.Context, pool *pgxpool.Pool, item string, token int64) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, "SELECT pgbaton.complete_tx(ARRAY[$1], ARRAY[$2::bigint], 'other')", item, token)
	require.NoError(t, err)
	return tx
}

// expired waits, by a poll with a deadline, until item's grant expired.
func expired(t *testing.T, ctx context.Context, pool *pgxpool.Pool, item string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var past bool
		return pool.QueryRow(ctx, "SELECT expires_at <= clock_timestamp() FROM pgbaton.lease WHERE name = $1", item).Scan(&past) == nil && past
	}, 30*time.Second, 10*time.Millisecond, "%s did not expire", item)
}

// A waiter behind an item that expired while a CompleteTx transaction
// still has its row locked cannot claim it, and nothing it can learn says
// when that transaction ends (its end notifies if it rolled back): it
// waits as for a group nobody holds, not at once again and again (about
// 210 statements in 1.5 s, against 5 behind a live item).
func TestWaitDoesNotSpinBehindRowLockedExpiredItem(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	sent := &statementCounter{}
	wpool := d.Pool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = sent })
	ctx := pgtest.Context(t, time.Minute)
	const window = 1500 * time.Millisecond
	const most = 20 // a few looks and registrations; a spin sends over 100

	for _, tc := range []struct {
		what string
		wait func(ctx context.Context, c *leasetable.Client, group string) error
	}{
		{"claimwait", func(ctx context.Context, c *leasetable.Client, group string) error {
			_, err := c.ClaimWait(ctx, group, 1)
			return err
		}},
		{"semaphore", func(ctx context.Context, c *leasetable.Client, group string) error {
			_, err := c.Semaphore(ctx, group, 1)
			return err
		}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			group := "locked-" + tc.what
			item := group + "-item"
			if tc.what == "semaphore" {
				item = group + "#0" // the semaphore's one slot
			}
			token := otherHolds(t, ctx, pool, group, item, 2*time.Second)
			c, waiting := claimWaiter(t, wpool, leasetable.Config{Owner: "waiter-" + tc.what, TTL: neverPoll})
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- tc.wait(wctx, c, group) }()
			<-waiting // registered, behind a live item
			completingTx(t, ctx, pool, item, token)
			expired(t, ctx, pool, item)
			before := len(sent.snapshot())
			stop := time.AfterFunc(window, cancel)
			defer stop.Stop()
			require.ErrorIs(t, <-done, context.Canceled)
			n := len(sent.snapshot()) - before
			t.Logf("statements sent by a %s waiting %s behind a row-locked expired item: %d", tc.what, window, n)
			assert.LessOrEqual(t, n, most)
		})
	}
}

// A ClaimWait registering while a CompleteTx transaction of its group is
// open must not wait for that row, and so never holds up Register: a
// worker adding items to a group cannot be stalled by another worker's
// open transaction.
func TestRegisterNotBlockedByWaiterBehindOpenCompleteTx(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	w := newClient(t, pool, leasetable.Config{Owner: "waiter", TTL: neverPoll})
	r := newClient(t, pool, leasetable.Config{Owner: "registrar"})
	token := otherHolds(t, ctx, pool, "gated", "gated-0", time.Hour)
	completingTx(t, ctx, pool, "gated-0", token) // rolled back before the clients close
	got := goClaimWait(ctx, w, "gated", 1)
	// The waiter is registered, or stuck registering behind the row.
	require.Eventually(t, func() bool {
		var there bool
		return pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pgbaton.lease_waiter WHERE name = 'gated')
			OR EXISTS (SELECT 1 FROM pg_stat_activity WHERE query LIKE '%wait_for%' AND wait_event_type = 'Lock')`).Scan(&there) == nil && there
	}, 30*time.Second, 10*time.Millisecond)

	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := r.Register(rctx, "gated", "gated-1")
	require.NoError(t, err, "Register was held up by a waiter")
	require.Equal(t, 1, n)
	g := awaitClaim(t, got, "the waiter did not claim the item registered")
	require.NoError(t, g.err)
	require.Len(t, g.leases, 1)
	assert.Equal(t, "gated-1", g.leases[0].Name())
}

// startGrace imposes a failover grace of d on the database of pool, as a
// timeline change would, without one.
func startGrace(t *testing.T, ctx context.Context, pool *pgxpool.Pool, d time.Duration) time.Time {
	t.Helper()
	var until time.Time
	require.NoError(t, pool.QueryRow(ctx, `UPDATE pgbaton.token_epoch SET grace_started_at = clock_timestamp(),
		grace_until = clock_timestamp() + $1 * interval '1 millisecond' WHERE one RETURNING grace_until`, d.Milliseconds()).Scan(&until))
	return until
}

// graceWaiters starts an Acquire of a free name, a ClaimWait on a group
// with a free item and a Semaphore with a free slot, all held back by a
// failover grace, and returns when each ended.
func graceWaiters(t *testing.T, ctx context.Context, pool *pgxpool.Pool, waiting chan string, c *leasetable.Client) <-chan claimed {
	t.Helper()
	_, err := c.Register(ctx, "grace-items", "grace-item")
	require.NoError(t, err)
	got := make(chan claimed, 3)
	go func() {
		l, err := c.Acquire(ctx, "grace-name")
		got <- claimed{[]*leasetable.Lease{l}, err, time.Now()}
	}()
	go func() { ls, err := c.ClaimWait(ctx, "grace-items", 1); got <- claimed{ls, err, time.Now()} }()
	go func() {
		l, err := c.Semaphore(ctx, "grace-sem", 1)
		got <- claimed{[]*leasetable.Lease{l}, err, time.Now()}
	}()
	for range 3 {
		select {
		case <-waiting:
		case <-time.After(30 * time.Second):
			t.Fatal("the waiters did not wait")
		}
	}
	return got
}

// Turning the failover grace off is how an operator ends it now: every
// caller waiting through it is woken and granted at once, not at the old
// grace's end.
func TestGraceOffWakesWaiters(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	waiting := make(chan string, 3)
	c := newClient(t, pool, leasetable.Config{Owner: "grace-waiter", TTL: neverPoll, Logger: logTo(waiting)})
	startGrace(t, ctx, pool, time.Hour)
	got := graceWaiters(t, ctx, pool, waiting, c)
	_, err := pool.Exec(ctx, "SELECT pgbaton.set_failover_grace(false, 'test: ended by hand')")
	require.NoError(t, err)
	for range 3 {
		g := awaitClaim(t, got, "a waiter was not woken when the grace was turned off")
		require.NoError(t, g.err)
		require.Len(t, g.leases, 1)
	}
}

// A wait held back by a failover grace ends when the grace ends, for
// every kind of waiter, not a TTL later.
func TestWaitsEndWithTheGrace(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	waiting := make(chan string, 3)
	// A TTL no waiter reaches in the test: a wait that ends in time ended
	// with the grace.
	c := newClient(t, pool, leasetable.Config{Owner: "grace-waiter", TTL: neverPoll, Logger: logTo(waiting)})
	until := startGrace(t, ctx, pool, 3*time.Second)
	got := graceWaiters(t, ctx, pool, waiting, c)
	for range 3 {
		g := awaitClaim(t, got, "a waiter did not get its lease when the grace ended")
		require.NoError(t, g.err)
		require.Len(t, g.leases, 1)
		var after time.Duration
		require.NoError(t, pool.QueryRow(ctx, "SELECT acquired_at - $2::timestamptz FROM pgbaton.lease WHERE name = $1",
			g.leases[0].Name(), until).Scan(&after))
		t.Logf("%s granted %s after the grace ended", g.leases[0].Name(), after)
		assert.GreaterOrEqual(t, after, time.Duration(0), "granted during the grace")
	}
}

// A session outside pgbaton holding the listen slots' advisory keys turns
// a client's wake-ups into polling: the client says so, once, with the
// query that finds the holder (it said nothing before).
func TestEverySlotTakenIsLogged(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	squatter, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer squatter.Release()
	_, err = squatter.Exec(ctx, "SELECT pg_advisory_lock(1885495924, 0)")
	require.NoError(t, err)
	defer squatter.Exec(context.Background(), "SELECT pg_advisory_unlock_all()") //nolint:errcheck

	holder := newClient(t, pool, leasetable.Config{Owner: "holder"})
	_, err = holder.TryAcquire(ctx, "busy")
	require.NoError(t, err)
	logs := &messages{}
	c := newClient(t, pool, leasetable.Config{Owner: "slotless", ListenSlots: 1, Logger: slog.New(logs)})
	for range 2 {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = c.Acquire(wctx, "busy")
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	n := 0
	for _, m := range logs.got {
		if strings.HasPrefix(m, "INFO pgbaton: every listen slot is taken") {
			n++
		}
	}
	assert.Equal(t, 1, n, "logged once per client: %q", logs.got)
}
