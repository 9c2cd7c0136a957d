package advisory_test

import (
	"context"
	"errors"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// Loss is reported within PingInterval + 1s of the backend's death, on
// every lock of the session, and new work gets a new session.
func TestLossAfterTerminate(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	const ping = 500 * time.Millisecond
	l := newLocker(t, pool, advisory.Config{PingInterval: ping})
	a, err := l.TryLock(ctx, advisory.Int64(1))
	require.NoError(t, err)
	b, err := l.TryRLock(ctx, advisory.Name("loss"))
	require.NoError(t, err)
	pid := holderPID(t, admin, d, 1)

	env.Terminate(t, pid)
	killed := time.Now()
	for _, lk := range []*advisory.Lock{a, b} {
		select {
		case <-lk.Done():
		case <-time.After(ping + time.Second - time.Since(killed)):
			t.Fatalf("loss not detected within PingInterval + 1s")
		}
		require.ErrorIs(t, lk.Err(), advisory.ErrLockLost)
		require.ErrorIs(t, context.Cause(lk.Context()), advisory.ErrLockLost)
	}
	require.ErrorIs(t, a.Unlock(ctx), advisory.ErrLockLost)
	require.Equal(t, int64(1), l.Stats().LostSessions)

	// The key is free again and new work reconnects.
	c, err := l.TryLock(ctx, advisory.Int64(1))
	require.NoError(t, err)
	require.NotEqual(t, pid, holderPID(t, admin, d, 1))
	require.NoError(t, c.Unlock(ctx))
}

// A server that ends an idle holder's session (pg_terminate_backend here;
// a shutdown or a Patroni switchover sends the same FATAL then EOF) is
// heard at once, not at the next ping: the lock is free on the server
// from that moment, and in a switchover the new primary may grant it
// within milliseconds. The HA test bed saw two holders overlap by 255 ms
// when the old holder only learnt at its next ping. The bound is far from
// both load (a stall of a second) and the next ping (a minute).
func TestTerminatedIdleSessionToldAtOnce(t *testing.T) {
	d := env.DB(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	const ping = time.Minute // the ping must not be what tells
	l := newLocker(t, d.Pool(t), advisory.Config{PingInterval: ping})
	for i := range 5 {
		key := advisory.Int64(int64(100 + i))
		lk, err := l.TryLock(ctx, key)
		require.NoError(t, err)
		pid := holderPID(t, admin, d, int64(100+i))
		time.Sleep(20 * time.Millisecond) // idle: what is asserted is that an idle session is watched
		env.Terminate(t, pid)
		killed := time.Now()
		select {
		case <-lk.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: loss not told within 10s of the termination (PingInterval %s)", i, ping)
		}
		t.Logf("round %d: told %s after pg_terminate_backend returned", i, time.Since(killed).Round(time.Microsecond))
		require.ErrorIs(t, lk.Err(), advisory.ErrLockLost)
	}
}

// A normal unlock is never reported as a loss, and an idle session stays
// up across many pings.
func TestNoFalseLoss(t *testing.T) {
	d := env.DB(t)
	l := newLocker(t, d.Pool(t), advisory.Config{PingInterval: 20 * time.Millisecond})
	ctx := pgtest.Context(t, time.Minute)
	lk, err := l.TryLock(ctx, advisory.Int64(5))
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // many ping intervals: what is asserted is the passage of time
	require.NoError(t, lk.Err())
	require.NoError(t, lk.Unlock(ctx))
	require.ErrorIs(t, lk.Err(), advisory.ErrUnlocked)
	require.NotErrorIs(t, lk.Err(), advisory.ErrLockLost)
}

// A silent network partition (a proxy that stalls without FIN or RST):
// the client reports the loss within PingInterval + PingTimeout, while the
// server still holds the lock, so nobody else can have been granted it
// before the holder gave up. Once the connection is cut, it is free.
func TestLossOnStalledNetwork(t *testing.T) {
	d := env.DB(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	proxied, proxy := env.ProxiedPool(t, d)
	const ping, timeout = 200 * time.Millisecond, 300 * time.Millisecond
	l := newLocker(t, proxied, advisory.Config{PingInterval: ping, PingTimeout: timeout})
	lk, err := l.TryLock(ctx, advisory.Int64(11))
	require.NoError(t, err)
	pid := holderPID(t, admin, d, 11)

	other := newLocker(t, d.Pool(t), advisory.Config{})
	proxy.Stall()
	stalled := time.Now()
	select {
	case <-lk.Done():
	case <-time.After(ping + timeout + time.Second):
		t.Fatal("loss not reported within PingInterval + PingTimeout + 1s of a silent partition")
	}
	require.ErrorIs(t, lk.Err(), advisory.ErrLockLost)
	t.Logf("loss reported %s after the stall", time.Since(stalled).Round(time.Millisecond))
	// The holder has given up; the server has not let go yet.
	_, err = other.TryLock(ctx, advisory.Int64(11))
	require.ErrorIs(t, err, advisory.ErrLocked)
	require.Equal(t, pid, holderPID(t, admin, d, 11))

	proxy.Cut()
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		lk, err := other.TryLock(ctx, advisory.Int64(11))
		if errors.Is(err, advisory.ErrLocked) {
			return false, nil
		}
		if err == nil {
			err = lk.Unlock(ctx)
		}
		return true, err
	}, "lock free after the partitioned connection was cut")
	proxy.Resume()
}

// The server-side TCP settings are those the timing argument (pgsession.serverTimeouts)
// needs: keepalive probes only after the client has given up, and the
// drop later still.
func TestSessionServerTimeouts(t *testing.T) {
	d := env.DB(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	l := newLocker(t, d.Pool(t), advisory.Config{PingInterval: time.Second, PingTimeout: 2 * time.Second})
	lk, err := l.TryLock(ctx, advisory.Int64(12))
	require.NoError(t, err)
	defer lk.Unlock(ctx)
	_ = holderPID(t, admin, d, 12)
	// A backend's settings are visible only to itself: ask the session.
	settings := advisory.SessionSettingsForTest(t, l)
	require.Equal(t, map[string]string{
		"tcp_keepalives_idle":     "4",
		"tcp_keepalives_interval": "1",
		"tcp_keepalives_count":    "3",
		"tcp_user_timeout":        "7000",
	}, settings)
}

// Mutual exclusion between OS processes: three children increment a
// counter with a read-modify-write under one lock; any overlap would lose
// updates.
func TestExclusionAcrossProcesses(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	_, err := pool.Exec(ctx, "CREATE TABLE counter (n int NOT NULL); INSERT INTO counter VALUES (0)")
	require.NoError(t, err)
	const children, each = 3, 30
	var kids []*pgtest.Child
	for range children {
		kids = append(kids, env.StartChild(t, "counter", d.URL, "counter-lock", strconv.Itoa(each)))
	}
	for _, k := range kids {
		k.Expect(t, "done", time.Minute)
		require.NoError(t, k.Wait(t, time.Minute))
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT n FROM counter").Scan(&n))
	require.Equal(t, children*each, n, "lost updates: two processes held the lock at once")
}

// A waiter acquires as soon as the holder process is SIGKILLed.
func TestWaiterAcquiresAfterHolderKilled(t *testing.T) {
	d := env.DB(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	holder := env.StartChild(t, "hold", d.URL, "victim-lock")
	holder.Expect(t, "locked", time.Minute)
	l := newLocker(t, d.Pool(t), advisory.Config{})
	_, err := l.TryLock(ctx, advisory.Name("victim-lock"))
	require.ErrorIs(t, err, advisory.ErrLocked)

	got := make(chan error, 1)
	var lk *advisory.Lock
	go func() {
		var err error
		lk, err = l.Lock(ctx, advisory.Name("victim-lock"))
		got <- err
	}()
	eventuallyWaiting(t, admin, d, 1)
	holder.Signal(t, syscall.SIGKILL)
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not granted after the holder was killed")
	}
	require.NoError(t, lk.Err())
	require.NoError(t, lk.Unlock(ctx))
}

// Waits whose context ends leave nothing in pg_locks: neither a waiting
// request nor a lock granted as the wait was given up.
func TestCancelledWaitsLeaveNothing(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	holder := newLocker(t, pool, advisory.Config{})
	l := newLocker(t, pool, advisory.Config{})
	key := advisory.Name("contended")
	held, err := holder.TryLock(ctx, key)
	require.NoError(t, err)

	// Plain timeout while the lock stays held.
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = l.Lock(wctx, key)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	granted, waiting := advisoryLocks(t, admin, d)
	require.Equal(t, 1, granted)
	require.Zero(t, waiting)

	// The race: release the lock and cancel the wait at the same moment,
	// many times; whoever wins, nothing may be left behind by the waiter.
	for i := range 30 {
		wctx, cancel := context.WithCancel(ctx)
		got := make(chan *advisory.Lock, 1)
		go func() {
			lk, _ := l.Lock(wctx, key)
			got <- lk
		}()
		eventuallyWaiting(t, admin, d, 1)
		go func() {
			time.Sleep(time.Duration(i%5) * 100 * time.Microsecond)
			cancel()
		}()
		require.NoError(t, held.Unlock(ctx))
		if lk := <-got; lk != nil {
			require.NoError(t, lk.Unlock(ctx))
		}
		cancel()
		granted, waiting := advisoryLocks(t, admin, d)
		require.Zero(t, granted, "iteration %d", i)
		require.Zero(t, waiting, "iteration %d", i)
		held, err = holder.TryLock(ctx, key)
		require.NoError(t, err)
	}
	require.NoError(t, held.Unlock(ctx))
}

// fn's context is cancelled with ErrLockLost when the lock is lost, and
// RunExclusive reports the loss even though fn returned nil.
func TestRunExclusiveLoss(t *testing.T) {
	d := env.DB(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	l := newLocker(t, d.Pool(t), advisory.Config{PingInterval: 100 * time.Millisecond})
	err := l.RunExclusive(ctx, advisory.Int64(21), func(ctx context.Context) error {
		env.Terminate(t, holderPID(t, admin, d, 21))
		<-ctx.Done()
		require.ErrorIs(t, context.Cause(ctx), advisory.ErrLockLost)
		return nil
	}, advisory.RunOptions{})
	require.ErrorIs(t, err, advisory.ErrLockLost)
}

// Sessions are the Locker's own: a pool's MaxConnLifetime and idle
// timeouts never close them, and they stay out of the pool's count.
func TestSessionsOutlivePoolLimits(t *testing.T) {
	d := env.DB(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	pool := d.Pool(t, func(cfg *pgxpool.Config) {
		cfg.MaxConnLifetime = 50 * time.Millisecond
		cfg.MaxConnLifetimeJitter = 0
		cfg.MaxConnIdleTime = 50 * time.Millisecond
		cfg.HealthCheckPeriod = 20 * time.Millisecond
	})
	l := newLocker(t, pool, advisory.Config{})
	lk, err := l.TryLock(ctx, advisory.Int64(31))
	require.NoError(t, err)
	pid := holderPID(t, admin, d, 31)
	// Give the pool a connection of its own and let it recycle it.
	_, err = pool.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		return pool.Stat().MaxLifetimeDestroyCount()+pool.Stat().MaxIdleDestroyCount() > 0, nil
	}, "pool recycled a connection")
	time.Sleep(200 * time.Millisecond) // several MaxConnLifetimes: time itself is what is tested
	require.NoError(t, lk.Err())
	require.Equal(t, pid, holderPID(t, admin, d, 31))
	require.NoError(t, lk.Unlock(ctx))
}

// Nothing is left connected after a Locker that did everything is closed.
func TestNoLeakedConnections(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, time.Minute)
	pool := d.Pool(t)
	l, err := advisory.New(pool, advisory.Config{MaxLocksPerSession: 2})
	require.NoError(t, err)
	other, err := advisory.New(pool, advisory.Config{})
	require.NoError(t, err)
	held, err := other.TryLock(ctx, advisory.Name("leak"))
	require.NoError(t, err)
	var locks []*advisory.Lock
	for i := range 5 {
		lk, err := l.TryLock(ctx, advisory.Int64(int64(i)))
		require.NoError(t, err)
		locks = append(locks, lk)
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = l.Lock(wctx, advisory.Name("leak"))
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// A wait granted: released once the server shows it waiting.
	lk := handOver(t, adminPool(t), d, held, l.Lock, advisory.Name("leak"))
	locks = append(locks, lk)
	for _, lk := range locks[:3] {
		require.NoError(t, lk.Unlock(ctx))
	}
	require.NoError(t, l.Close(ctx))
	require.NoError(t, other.Close(ctx))
	pool.Close()
	env.NoConnections(t, d)
}

// A holder process paused (SIGSTOP) for longer than PingInterval +
// PingTimeout reports its lock lost when it resumes, even though its
// kernel kept the connection up, and gives the lock up.
func TestPausedHolderReportsLoss(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, time.Minute)
	child := env.StartChild(t, "watch", d.URL, "paused")
	child.Expect(t, "locked", time.Minute)
	child.Signal(t, syscall.SIGSTOP)
	time.Sleep(500 * time.Millisecond) // the pause itself is the fault
	l := newLocker(t, d.Pool(t), advisory.Config{})
	_, err := l.TryLock(ctx, advisory.Name("paused"))
	require.ErrorIs(t, err, advisory.ErrLocked, "a paused holder keeps its session")
	child.Signal(t, syscall.SIGCONT)
	msg := child.Expect(t, "lost", 5*time.Second)
	require.Contains(t, msg, "lock lost")
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		lk, err := l.TryLock(ctx, advisory.Name("paused"))
		if errors.Is(err, advisory.ErrLocked) {
			return false, nil
		}
		if err == nil {
			err = lk.Unlock(ctx)
		}
		return true, err
	}, "the resumed holder gave its lock up")
}

// A server crash and restart: every lock is reported lost, and the Locker
// works again on new sessions once the server is back.
func TestServerRestart(t *testing.T) {
	if env.Cluster() == nil {
		t.Skip("needs the throwaway cluster") // only with PGBATON_TEST_DSN
	}
	d := env.DB(t)
	ctx := pgtest.Context(t, time.Minute)
	const ping = 200 * time.Millisecond
	l := newLocker(t, d.Pool(t), advisory.Config{PingInterval: ping})
	a, err := l.TryLock(ctx, advisory.Int64(41))
	require.NoError(t, err)
	b, err := l.TryLock(ctx, advisory.Name("restart"))
	require.NoError(t, err)
	env.Restart(t, pgcluster.Immediate)
	for _, lk := range []*advisory.Lock{a, b} {
		select {
		case <-lk.Done():
		case <-time.After(ping + advisory.DefaultPingTimeout + time.Second):
			t.Fatal("loss not reported after a server crash")
		}
		require.ErrorIs(t, lk.Err(), advisory.ErrLockLost)
	}
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		lk, err := l.TryLock(ctx, advisory.Int64(41))
		if err != nil {
			return false, nil // the pool may still hand out dead connections
		}
		return true, lk.Unlock(ctx)
	}, "locking works again after the restart")
}

// A session kept idle for the next blocking wait (a spare) whose backend
// is terminated is replaced without the wait failing, and its end is not
// a lost session: it held nothing.
func TestWaitAfterSpareTerminated(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	l := newLocker(t, pool, advisory.Config{})
	other := newLocker(t, pool, advisory.Config{})
	key := advisory.Int64(77)

	// contended has l wait for key while other holds it, and returns the
	// backend l got it on.
	contended := func() uint32 {
		t.Helper()
		held, err := other.Lock(ctx, key)
		require.NoError(t, err)
		got := make(chan *advisory.Lock, 1)
		go func() {
			lk, err := l.Lock(ctx, key)
			assert.NoError(t, err)
			got <- lk
		}()
		eventuallyWaiting(t, admin, d, 1)
		require.NoError(t, held.Unlock(ctx))
		lk := <-got
		require.NotNil(t, lk)
		pid := holderPID(t, admin, d, 77)
		require.NoError(t, lk.Unlock(ctx)) // its session becomes a spare
		return pid
	}
	spare := contended()
	connects := l.Stats().Connects
	env.Terminate(t, spare)
	again := contended()
	assert.NotEqual(t, spare, again)
	assert.Equal(t, connects+1, l.Stats().Connects, "one new connection for the wait")
	assert.Zero(t, l.Stats().LostSessions)
}

// A deadline that fires while a session is being set up, at whatever step,
// is reported as the caller's deadline: errors.Is(err,
// context.DeadlineExceeded) holds, not a bare i/o timeout of the socket.
// A slow link (25 ms each way) spreads the setup's round trips over
// hundreds of milliseconds; the deadlines step through the last of them
// (the session's statements are prepared), which is read on the raw
// socket.
func TestSessionSetupDeadlineIsTheCallersError(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, time.Minute)
	proxied, proxy := env.ProxiedPool(t, d)
	require.NoError(t, proxied.Ping(ctx))
	proxy.SetLatency(25 * time.Millisecond)
	tryLock := func(deadline time.Duration) (time.Duration, error) {
		l, err := advisory.New(proxied, advisory.Config{})
		require.NoError(t, err)
		defer func() { require.NoError(t, l.Close(ctx)) }()
		wctx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		start := time.Now()
		lk, err := l.TryLock(wctx, advisory.Int64(21))
		took := time.Since(start)
		if err == nil {
			require.NoError(t, lk.Unlock(ctx))
		}
		return took, err
	}
	setup, err := tryLock(time.Minute)
	require.NoError(t, err)
	timedOut := 0
	try := func(deadline time.Duration) {
		if _, err := tryLock(deadline); err != nil {
			require.ErrorIs(t, err, context.DeadlineExceeded, "deadline %s of a %s setup", deadline, setup)
			timedOut++
		}
	}
	for deadline := setup - 80*time.Millisecond; deadline <= setup; deadline += 8 * time.Millisecond {
		try(deadline)
	}
	// A busy machine may have slowed the one measured setup more than
	// those after it, which then all beat their deadlines: the window
	// moves earlier until a deadline fires during a setup. Each that
	// fires is checked as above.
	for deadline := setup - 88*time.Millisecond; timedOut == 0 && deadline > 0; deadline -= 8 * time.Millisecond {
		try(deadline)
	}
	require.NotZero(t, timedOut, "no deadline fired during the setup")
}
