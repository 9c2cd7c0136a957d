package leasetable_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/migrations"
)

// Waiter registrations live in an unlogged table, which a crash (and a
// failover: a promoted standby has no unlogged rows) empties. A waiter
// that registered before is registered again when its LISTEN connection
// comes back, so the next release still wakes it at once, not at the
// holder's expiry. Found by the HA test bed: after a switchover a worker
// waited out its whole 4 s acquire timeout behind holders that released
// every few hundred milliseconds.
func TestWaiterWokenAfterServerCrash(t *testing.T) {
	cl := pgtest.NewCluster(t, pgcluster.Config{}) // durable: the lease row survives the crash
	ctx := pgtest.Context(t, 2*time.Minute)
	require.NoError(t, migrations.UpURL(ctx, cl.URL("postgres")))
	pool := pgtest.Pool(t, cl.URL("postgres"))
	const ttl = 30 * time.Second
	holder := newClient(t, pool, leasetable.Config{Owner: "holder", TTL: ttl, RenewInterval: 200 * time.Millisecond})
	// The waiter's pool checks every connection before use, so that its
	// looks after the crash do not fail on connections the crash broke.
	wpool := pgtest.Pool(t, cl.URL("postgres"), func(c *pgxpool.Config) {
		c.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
	})
	waiter := newClient(t, wpool, leasetable.Config{Owner: "waiter", TTL: ttl})
	l, err := holder.TryAcquire(ctx, "w")
	require.NoError(t, err)

	got := make(chan *leasetable.Lease, 1)
	go func() {
		wl, err := waiter.Acquire(ctx, "w")
		if err != nil {
			t.Errorf("acquire: %v", err)
		}
		got <- wl
	}()
	queued(t, ctx, pool, "w", 1)

	before := l.ExpiresAt()
	require.NoError(t, cl.Restart(ctx, pgcluster.Immediate)) // empties lease_waiter
	pgtest.Eventually(t, 20*time.Second, func() (bool, error) {
		return l.ExpiresAt().After(before), l.Err()
	}, "the holder did not renew after the crash")
	// The waiter's LISTEN connection is back once Check passes (but
	// nothing says it registered again).
	pgtest.Eventually(t, 20*time.Second, func() (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return waiter.Check(cctx) == nil, nil
	}, "the waiter's LISTEN connection did not come back")

	released := time.Now()
	require.NoError(t, l.Release(ctx))
	select {
	case wl := <-got:
		require.NotNil(t, wl)
		t.Logf("granted %s after the release", time.Since(released).Round(time.Millisecond))
		require.NoError(t, wl.Release(ctx))
	case <-time.After(5 * time.Second):
		t.Fatalf("the waiter was not woken by the release (it would wait for the holder's expiry, %s)", ttl)
	}
}

// After an outage the LISTEN connection retries on a backoff; a wait that
// starts meanwhile reconnects it at once instead of waiting for the next
// retry. Found by the HA test bed: a worker whose acquire started as the
// new primary came up waited 2.4 s for its LISTEN connection. Twice: an
// outage that the connection slept through (paused, nobody waiting), and
// one it saw (listening for a bystander's wait).
//
// Not timed against the backoff's real length (a quarter of a second),
// which load can eat: the backoff is set to a minute, so the connection is
// back within seconds of the wait only if the wait reconnected it. A wait
// is granted either way (it polls while the connection is down), so the
// test asks the connection itself (Check).
func TestWaitAfterOutageReconnectsAtOnce(t *testing.T) {
	const backoff = time.Minute
	leasetable.SetListenRetry(t, backoff, backoff)
	cl := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true})
	ctx := pgtest.Context(t, 2*time.Minute)
	require.NoError(t, migrations.UpURL(ctx, cl.URL("postgres")))
	pool := pgtest.Pool(t, cl.URL("postgres"), func(c *pgxpool.Config) {
		c.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
	})
	const ttl = 30 * time.Second
	holder := newClient(t, pool, leasetable.Config{Owner: "holder", TTL: ttl})
	waiter := newClient(t, pool, leasetable.Config{Owner: "waiter", TTL: ttl})
	listens := func() (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return waiter.Check(cctx) == nil, nil
	}
	// wait has the waiter wait for name, held by holder, until released.
	wait := func(name string) (waited <-chan error, release func()) {
		l, err := holder.TryAcquire(ctx, name)
		require.NoError(t, err)
		got := make(chan error, 1)
		go func() {
			wl, err := waiter.Acquire(ctx, name)
			if err == nil {
				err = wl.Release(ctx)
			}
			got <- err
		}()
		queued(t, ctx, pool, name, 1)
		return got, func() { require.NoError(t, l.Release(ctx)) }
	}
	// waitOnce waits for name and requires the LISTEN connection back
	// within far less than the backoff.
	waitOnce := func(name string) {
		got, release := wait(name)
		pgtest.Eventually(t, 20*time.Second, listens,
			"%s: the LISTEN connection did not come back while a wait needed it (it waited for its backoff, %s)", name, backoff)
		release()
		require.NoError(t, <-got)
	}
	outage := func() {
		require.NoError(t, cl.Halt(pgcluster.Immediate))
		require.NoError(t, cl.Restart(ctx, pgcluster.Immediate))
	}

	waitOnce("outage:0") // starts the LISTEN connection
	pgtest.Eventually(t, 20*time.Second, func() (bool, error) { return leasetable.ListenerIdle(waiter), nil },
		"the LISTEN connection did not pause after the wait")
	outage() // unseen: the paused connection reads nothing
	waitOnce("outage:1")

	bystander, release := wait("bystander")
	outage() // seen: the connection listens for the bystander
	pgtest.Eventually(t, 20*time.Second, func() (bool, error) {
		ok, err := listens()
		return !ok, err
	}, "the LISTEN connection did not notice the outage")
	waitOnce("outage:2")
	release()
	require.NoError(t, <-bystander)
}

// A waiter that gives up while its client's LISTEN connection is down
// hands its turn on at once: its registration is removed on the pool, not
// kept for a connection that may not come back soon. Before, the removal
// waited for the LISTEN connection (up to 1,024 of them), and the next
// waiter, woken by nobody, waited for the holder's expiry.
func TestLeaverHandsOnWhileItsListenConnectionIsDown(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	_, proxy := env.ProxiedPool(t, d)
	u, err := url.Parse(d.URL)
	require.NoError(t, err)
	u.Host = proxy.Addr()
	const long = 10 * time.Minute // no look, renewal or poll in the test's time
	holder := newClient(t, pool, leasetable.Config{Owner: "holder", TTL: long})
	leaving := make(chan string, 1)
	leaver := newClient(t, pool, leasetable.Config{Owner: "leaver", TTL: long, PollInterval: long, ListenDSN: u.String(), Logger: logTo(leaving)})
	waiting := make(chan string, 1)
	next := newClient(t, pool, leasetable.Config{Owner: "next", TTL: long, PollInterval: long, Logger: logTo(waiting)})
	l, err := holder.TryAcquire(ctx, "d")
	require.NoError(t, err)

	lctx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	left := make(chan error, 1)
	go func() {
		_, err := leaver.Acquire(lctx, "d")
		left <- err
	}()
	require.Equal(t, "d", <-leaving)
	got := make(chan error, 1)
	go func() {
		nl, err := next.Acquire(ctx, "d")
		if err == nil {
			err = nl.Release(ctx)
		}
		got <- err
	}()
	require.Equal(t, "d", <-waiting) // behind the leaver

	require.NoError(t, proxy.Close()) // the leaver's LISTEN connection is down, and stays down
	giveUp()
	require.ErrorIs(t, <-left, context.Canceled)
	require.NoError(t, l.Release(ctx))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the next waiter was not woken: the leaver kept its turn")
	}
}

// A LISTEN connection whose probe came back late (a slow link, a busy
// server) is not given up on for good: the client polls meanwhile and
// Check reports the degraded mode, then a later wait proves the connection
// again, and once it delivers, waiters wake at once again. Before, one
// late probe left the client polling until it closed.
func TestLateProbeIsProvedAgain(t *testing.T) {
	leasetable.SetUndeliveredRetry(t, 100*time.Millisecond)
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 2*time.Minute)
	_, proxy := env.ProxiedPool(t, d)
	u, err := url.Parse(d.URL)
	require.NoError(t, err)
	u.Host = proxy.Addr()
	// The probe waits a second at most (TTL/10, from 250ms to 1s).
	const ttl = time.Minute
	holder := newClient(t, pool, leasetable.Config{Owner: "holder", TTL: ttl})
	c := newClient(t, pool, leasetable.Config{Owner: "late", TTL: ttl, PollInterval: ttl, ListenDSN: u.String()})
	l, err := holder.TryAcquire(ctx, "late")
	require.NoError(t, err)
	// waitBriefly subscribes a waiter, which starts or proves the LISTEN
	// connection.
	waitBriefly := func() {
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := c.Acquire(wctx, "late")
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}

	proxy.SetLatency(1500 * time.Millisecond)
	pgtest.Eventually(t, 60*time.Second, func() (bool, error) {
		waitBriefly()
		return errors.Is(c.Check(ctx), pgbaton.ErrDegraded), nil
	}, "the late probe was not noticed")

	proxy.SetLatency(0)
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		waitBriefly()
		return c.Check(ctx) == nil, nil
	}, "the connection was not proved again once it delivered")

	// A waiter wakes at the release, not at the next poll (a minute).
	got := make(chan error, 1)
	go func() {
		nl, err := c.Acquire(ctx, "late")
		if err == nil {
			err = nl.Release(ctx)
		}
		got <- err
	}()
	queued(t, ctx, pool, "late", 1)
	require.NoError(t, l.Release(ctx))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter was not woken by the release")
	}
}

// A LISTEN connection that was up starts its reconnection backoff over: a
// failure after an outage that grew the backoff is retried after
// listener.Retry's minimum, not after the grown delay (during which
// releases wake nobody). Read from the delay each retry logs, not timed.
func TestListenRetryStartsOverAfterAConnection(t *testing.T) {
	leasetable.SetListenRetry(t, 10*time.Millisecond, time.Minute)
	ctx := pgtest.Context(t, time.Minute)
	d := env.DB(t)
	admin := d.Pool(t)
	role := fmt.Sprintf("listen_retry_%d", time.Now().UnixNano())
	for _, sql := range []string{
		"CREATE ROLE " + role + " LOGIN PASSWORD 'listen' CONNECTION LIMIT 0",
		"GRANT USAGE ON SCHEMA pgbaton TO " + role,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgbaton TO " + role,
	} {
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	t.Cleanup(func() {
		_, _ = env.AdminPool().Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE IF EXISTS "+role)
	})
	u, err := url.Parse(d.URL)
	require.NoError(t, err)
	u.User = url.UserPassword(role, "listen")

	retries := make(chan time.Duration, 1000)
	c := newClient(t, d.Pool(t), leasetable.Config{Owner: "retry-waiter", TTL: time.Minute, ListenDSN: u.String(),
		Logger: slog.New(retryLog{retries})})
	holder := newClient(t, d.Pool(t), leasetable.Config{Owner: "retry-holder", TTL: time.Minute})
	held, err := holder.TryAcquire(ctx, "retry")
	require.NoError(t, err)
	got := acquireThenRelease(ctx, c, "retry")
	// The role may not connect: the backoff grows (10, 20, 40, ... ms).
	var last time.Duration
	for range 6 {
		select {
		case last = <-retries:
		case <-ctx.Done():
			t.Fatal("the LISTEN connection was not retried")
		}
	}
	require.Greater(t, last, 200*time.Millisecond, "the sixth retry's delay")

	_, err = admin.Exec(ctx, "ALTER ROLE "+role+" CONNECTION LIMIT -1")
	require.NoError(t, err)
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) { return c.Check(ctx) == nil, nil },
		"the LISTEN connection delivers")
	for len(retries) > 0 {
		<-retries // logged before it connected
	}
	require.Equal(t, 1, pgtest.Count(t, admin, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'pgbaton lease listener retry-waiter'"))
	select {
	case delay := <-retries:
		assert.Less(t, delay, 100*time.Millisecond, "the retry after a connection that was up")
	case <-ctx.Done():
		t.Fatal("the LISTEN connection was not retried")
	}
	require.NoError(t, held.Release(ctx))
	require.NoError(t, <-got)
}

// retryLog sends the delay of each "reconnecting" line to ch.
type retryLog struct{ ch chan<- time.Duration }

func (h retryLog) Enabled(context.Context, slog.Level) bool { return true }
func (h retryLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h retryLog) WithGroup(string) slog.Handler            { return h }
func (h retryLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "pgbaton: lease LISTEN connection failed; reconnecting" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "in" {
			select {
			case h.ch <- a.Value.Duration():
			default:
			}
		}
		return a.Key != "in"
	})
	return nil
}
