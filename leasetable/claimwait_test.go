package leasetable_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// neverPoll is a PollInterval and TTL no test waits out: a waiter that
// returns in time was woken by a notification or by a known expiry.
const neverPoll = time.Hour

// claimWaiter is a client whose "waiting to claim" log lines go to
// waiting, so that tests act once it waits, without sleeping.
func claimWaiter(t *testing.T, pool *pgxpool.Pool, cfg leasetable.Config) (*leasetable.Client, chan string) {
	waiting := make(chan string, 1)
	cfg.Logger = logTo(waiting)
	return newClient(t, pool, cfg), waiting
}

// claimed is what a ClaimWait in the background returned, and when.
type claimed struct {
	leases []*leasetable.Lease
	err    error
	at     time.Time
}

func goClaimWait(ctx context.Context, c *leasetable.Client, group string, n int) <-chan claimed {
	got := make(chan claimed, 1)
	go func() {
		ls, err := c.ClaimWait(ctx, group, n)
		got <- claimed{ls, err, time.Now()}
	}()
	return got
}

// awaitClaim is what got delivers, failing t with why if it takes longer
// than any wait the test allows for.
func awaitClaim(t *testing.T, got <-chan claimed, why string) claimed {
	t.Helper()
	select {
	case g := <-got:
		return g
	case <-time.After(30 * time.Second):
		t.Fatal(why)
		return claimed{}
	}
}

// A waiting ClaimWait wakes on the NOTIFY of Register: neither its
// PollInterval nor its TTL would wake it within the test's time.
func TestClaimWaitWakesOnRegister(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 2*time.Minute)
	producer := newClient(t, pool, leasetable.Config{Owner: "producer", TTL: neverPoll})
	worker, waiting := claimWaiter(t, pool, leasetable.Config{Owner: "worker", TTL: neverPoll, PollInterval: neverPoll})
	const rounds = 50
	lat := make([]time.Duration, 0, rounds)
	for i := range rounds {
		got := goClaimWait(ctx, worker, "q", 10)
		require.Equal(t, "q", <-waiting)
		start := time.Now()
		name := fmt.Sprintf("item-%d", i)
		_, err := producer.Register(ctx, "q", name)
		require.NoError(t, err)
		g := awaitClaim(t, got, fmt.Sprintf("round %d: ClaimWait not woken by Register", i))
		require.NoError(t, g.err)
		lat = append(lat, g.at.Sub(start))
		require.Len(t, g.leases, 1)
		assert.Equal(t, name, g.leases[0].Name())
		require.NoError(t, g.leases[0].Complete(ctx))
	}
	t.Logf("Register → waiting ClaimWait returns (LISTEN): p50 %s p99 %s over %d", percentile(lat, 50), percentile(lat, 99), rounds)
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		return pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_waiter") == 0, nil
	}, "waiter registrations left behind")
}

// Register wakes the waiters of a group once per statement, as many as
// there are free items (oldest first), however many rows it created, and
// only when it created some and somebody waits: the payload is the
// waiter's id.
func TestRegisterNotifiesGroupWaitersOnce(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	conn := listenConn(t, ctx, pool)
	notifications := func() (got []string) {
		for {
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			n, err := conn.WaitForNotification(wctx)
			cancel()
			if err != nil {
				return got
			}
			got = append(got, n.Payload)
		}
	}
	register := func(names ...string) {
		_, err := pool.Exec(ctx, "SELECT pgbaton.register('g', $1)", names)
		require.NoError(t, err)
	}
	register("a", "b")
	assert.Empty(t, notifications(), "no waiter registered: no NOTIFY")
	_, err := pool.Exec(ctx, "SELECT pgbaton.wait_for('g', 'someone/1', true)")
	require.NoError(t, err)
	register("c", "d", "e")
	assert.Equal(t, []string{"someone/1"}, notifications(), "one NOTIFY for the one waiter, its id as payload")
	register("c", "d")
	assert.Empty(t, notifications(), "nothing new: no NOTIFY")
}

// A waiter's registration and a Register racing with it are ordered: the
// waiter's next claim sees the items, or Register sees the waiter and
// notifies. Each side holds its transaction open to force the race.
func TestRegisterRacingWaiterRegistration(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	blocked := func(what string) {
		pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
			return pgtest.Count(t, pool, "SELECT count(*) FROM pg_locks WHERE NOT granted") > 0, nil
		}, "%s did not wait for the open transaction", what)
	}

	t.Run("register first", func(t *testing.T) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(context.Background())
		_, err = tx.Exec(ctx, "SELECT pgbaton.register('r1', '{x}')")
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			_, err := pool.Exec(ctx, "SELECT pgbaton.wait_for('r1', 'w/1', true)")
			done <- err
		}()
		blocked("wait_for")
		require.NoError(t, tx.Commit(ctx))
		require.NoError(t, <-done)
		assert.Equal(t, 1, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.claim('r1', 'w', 1, 60000)"),
			"the claim after the registration sees the item")
	})

	t.Run("waiter first", func(t *testing.T) {
		conn := listenConn(t, ctx, pool)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(context.Background())
		_, err = tx.Exec(ctx, "SELECT pgbaton.wait_for('r2', 'w/2', true)")
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			_, err := pool.Exec(ctx, "SELECT pgbaton.register('r2', '{y}')")
			done <- err
		}()
		blocked("register")
		require.NoError(t, tx.Commit(ctx))
		require.NoError(t, <-done)
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		require.NoError(t, err, "register saw the waiter and notified")
		assert.Equal(t, "w/2", n.Payload)
	})
}

// A waiting ClaimWait wakes when another worker releases an item.
func TestClaimWaitWakesOnRelease(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	other := newClient(t, pool, leasetable.Config{Owner: "other", TTL: neverPoll})
	worker, waiting := claimWaiter(t, pool, leasetable.Config{Owner: "worker", TTL: neverPoll, PollInterval: neverPoll})
	_, err := other.Register(ctx, "q", "only")
	require.NoError(t, err)
	held, err := other.Claim(ctx, "q", 1)
	require.NoError(t, err)
	require.Len(t, held, 1)
	got := goClaimWait(ctx, worker, "q", 1)
	require.Equal(t, "q", <-waiting)
	require.NoError(t, held[0].Release(ctx))
	g := awaitClaim(t, got, "ClaimWait not woken by the release")
	require.NoError(t, g.err)
	require.Len(t, g.leases, 1)
	assert.Equal(t, "only", g.leases[0].Name())
	assert.Greater(t, g.leases[0].Token(), held[0].Token())
}

// A waiting ClaimWait takes over the item of a worker that stopped
// renewing at the item's expiry: no event announces it, the waiter knows
// when it is due. On a loaded machine the item can expire before the
// waiter's first look, which then claims it without waiting: the round is
// run again with a lease twice as long, until the waiter waited.
func TestClaimWaitWakesOnExpiry(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 2*time.Minute)
	worker, waiting := claimWaiter(t, pool, leasetable.Config{Owner: "worker", TTL: neverPoll, PollInterval: neverPoll})
	for ttl := time.Second; ; ttl *= 2 {
		require.LessOrEqual(t, ttl, 16*time.Second, "the waiter never looked before the item expired")
		item := fmt.Sprintf("orphan-%s", ttl)
		_, err := worker.Register(ctx, "q", item)
		require.NoError(t, err)
		// A worker that claims the item for ttl, then dies.
		require.Equal(t, 1, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.claim('q', 'dead-worker', 1, $1)", ttl.Milliseconds()))
		select { // a line of the round before, logged as its wait ended
		case <-waiting:
		default:
		}
		start := time.Now()
		got := goClaimWait(ctx, worker, "q", 1)
		var waited bool
		select {
		case <-waiting:
			waited = true
		case g := <-got:
			got = replay(g)
		}
		g := awaitClaim(t, got, "ClaimWait not woken at the item's expiry")
		require.NoError(t, g.err)
		require.Len(t, g.leases, 1)
		assert.Equal(t, item, g.leases[0].Name())
		require.NoError(t, g.leases[0].Complete(ctx))
		if waited {
			t.Logf("taken over %s after the claim of a %s lease", g.at.Sub(start), ttl)
			return
		}
		t.Logf("the %s lease expired before the waiter's first look: again with a longer one", ttl)
	}
}

// replay delivers g again.
func replay(g claimed) <-chan claimed {
	ch := make(chan claimed, 1)
	ch <- g
	return ch
}

// With NoListen a waiting ClaimWait polls every PollInterval: it still
// returns once items are registered. It opens no LISTEN connection, and
// queues like any waiter.
func TestClaimWaitNoListenPolls(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	producer := newClient(t, pool, leasetable.Config{Owner: "producer", TTL: neverPoll})
	worker, waiting := claimWaiter(t, pool, leasetable.Config{Owner: "worker", TTL: neverPoll, NoListen: true, PollInterval: 100 * time.Millisecond})
	got := goClaimWait(ctx, worker, "q", 5)
	require.Equal(t, "q", <-waiting)
	assert.Equal(t, 1, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_queue WHERE name = 'q'"), "a polling waiter queues")
	assert.Zero(t, pgtest.Count(t, pool, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '%lease listener%'"),
		"a polling waiter opens no LISTEN connection")
	_, err := producer.Register(ctx, "q", "a", "b")
	require.NoError(t, err)
	g := awaitClaim(t, got, "polling ClaimWait did not return")
	require.NoError(t, g.err)
	assert.Len(t, g.leases, 2)
}

// A ClaimWait whose context ends returns at once with the context's error
// and leaves no registration behind: not in pgbaton.lease_waiter, not in
// the client's listener, and no goroutine.
func TestClaimWaitCancelled(t *testing.T) {
	// The listener ends only with the client, so that no new one starts
	// in the loop below, however slow it runs.
	leasetable.SetSlotKeep(t, time.Hour)
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	worker, waiting := claimWaiter(t, pool, leasetable.Config{Owner: "worker", TTL: neverPoll, PollInterval: neverPoll})
	// Start the listener and the session first: they live until Close, so
	// they are no leak. A wait that got as far as waiting has started the
	// listener (a wait timed out after 50 ms could end before, and under
	// load the listener then started in the loop and was reported).
	_, err := worker.Register(ctx, "warm", "w")
	require.NoError(t, err)
	warm, err := worker.ClaimWait(ctx, "warm", 1)
	require.NoError(t, err)
	require.NoError(t, warm[0].Complete(ctx))
	wctx, cancel := context.WithCancel(ctx)
	got := goClaimWait(wctx, worker, "warm", 1)
	require.Equal(t, "warm", <-waiting)
	cancel()
	require.ErrorIs(t, awaitClaim(t, got, "ClaimWait did not return when its context ended").err, context.Canceled)
	require.True(t, leasetable.ListenerStarted(worker), "the wait did not start the LISTEN connection")
	ignore := goleak.IgnoreCurrent()

	for range 3 {
		cctx, cancel := context.WithCancel(ctx)
		got := goClaimWait(cctx, worker, "q", 1)
		require.Equal(t, "q", <-waiting)
		cancel()
		g := awaitClaim(t, got, "ClaimWait did not return when its context ended")
		require.ErrorIs(t, g.err, context.Canceled)
		assert.Nil(t, g.leases)
	}
	_, err = worker.ClaimWait(canceled(ctx), "q", 1)
	require.ErrorIs(t, err, context.Canceled)

	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		return pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_waiter") == 0, nil
	}, "waiter registrations left behind")
	assert.Zero(t, leasetable.ListenerWaiters(worker), "wake-up channels left subscribed")
	// A goroutine may still be finishing (the test's own, having handed
	// over its result), for longer than goleak's retries (about 0.4 s)
	// on a loaded machine; a leaked one is still there after seconds.
	for deadline := time.Now().Add(10 * time.Second); goleak.Find(ignore) != nil && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	goleak.VerifyNone(t, ignore)
	// Nothing was claimed meanwhile: an item registered now is free.
	_, err = worker.Register(ctx, "q", "late")
	require.NoError(t, err)
	assert.Equal(t, 1, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE lease_group = 'q' AND owner IS NULL"))
}

func canceled(ctx context.Context) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	return ctx
}

// Close ends a waiting ClaimWait with ErrClosed.
func TestClaimWaitEndsWithClose(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	waiting := make(chan string, 1)
	worker, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "worker", TTL: neverPoll, Logger: logTo(waiting)})
	require.NoError(t, err)
	got := goClaimWait(ctx, worker, "q", 1)
	require.Equal(t, "q", <-waiting)
	require.NoError(t, worker.Close(ctx))
	g := <-got
	require.ErrorIs(t, g.err, pgbaton.ErrClosed)
	assert.Zero(t, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_waiter"))
}

func TestClaimWaitBadInput(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	c := newClient(t, pool, leasetable.Config{TTL: time.Minute})
	for _, tc := range []struct {
		group string
		n     int
	}{{"", 1}, {"q", 0}, {"q", -1}, {"q", 1<<20 + 1}, {strings.Repeat("g", 256), 1}} {
		_, err := c.ClaimWait(ctx, tc.group, tc.n)
		assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "group %q n %d", tc.group, tc.n)
	}
	assert.Zero(t, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_waiter"))
	require.NoError(t, c.Close(ctx))
	_, err := c.ClaimWait(ctx, "q", 1)
	assert.True(t, errors.Is(err, pgbaton.ErrClosed), "got %v", err)
}
