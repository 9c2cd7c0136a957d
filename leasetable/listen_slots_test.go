package leasetable_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// listenSlotsHeld counts the listen slots (pgbaton.listen_start's advisory
// locks) held by the LISTEN connections of clients whose owner starts with
// owner.
func listenSlotsHeld(t testing.TB, pool *pgxpool.Pool, owner string) int {
	t.Helper()
	return pgtest.Count(t, pool, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.classid = 1885495924 AND l.objsubid = 2 AND l.granted
		  AND a.application_name LIKE 'pgbaton lease listener ' || $1 || '%'`, owner)
}

// acquireThenRelease acquires name with c on a goroutine of its own,
// releases it, and sends the first error (or nil) on the channel returned.
func acquireThenRelease(ctx context.Context, c *leasetable.Client, name string) <-chan error {
	got := make(chan error, 1)
	go func() {
		l, err := c.Acquire(ctx, name)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	return got
}

// At most ListenSlots clients of a database listen at once: every NOTIFY
// signals every listening backend of the database, so a fleet whose
// clients all listened spent the server on signals (a fleet of 100 on 2
// cores: 152 acquires/s against 557 with NoListen, p50 210 ms against
// 6 ms). Four clients wait with two slots: two listen and register as
// waiters, two poll without registering (releases do not notify for
// them), and all four get their lease soon after its release.
func TestListenSlotsCapListeningClients(t *testing.T) {
	leasetable.SetSlotKeep(t, 500*time.Millisecond)
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	holder := newClient(t, pool, leasetable.Config{Owner: "slots-holder", TTL: time.Hour})
	const clients = 4
	waits := make(chan string, clients)
	leases := make([]*leasetable.Lease, clients)
	got := make(chan error, clients)
	for i := range clients {
		name := fmt.Sprintf("slots/%d", i)
		var err error
		leases[i], err = holder.TryAcquire(ctx, name)
		require.NoError(t, err)
		// Only a notification or the slotless polling can wake these in time.
		c := newClient(t, pool, leasetable.Config{Owner: fmt.Sprintf("slots-waiter-%d", i), TTL: time.Hour,
			PollInterval: time.Hour, ListenSlots: 2, Logger: logTo(waits)})
		go func() {
			l, err := c.Acquire(ctx, name)
			if err == nil {
				err = l.Release(ctx)
			}
			got <- err
		}()
	}
	for range clients {
		select {
		case <-waits:
		case <-ctx.Done():
			t.Fatal("not every client waits")
		}
	}
	// A client whose LISTEN connection came up later than listener.ReadyWait
	// polls although it takes a slot then: registrations are at most the
	// slots.
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		return listenSlotsHeld(t, pool, "slots-waiter-") == 2, nil
	}, "two of the four waiting clients should hold the two slots")
	// A waiter may log twice (woken to poll when its client found no
	// slot) before another has logged once: wait for all of them.
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		return pgtest.Count(t, pool, `SELECT count(*) FROM pgbaton.lease_queue WHERE name LIKE 'slots/%'`) == clients, nil
	}, "every waiting client queues, listening or polling")

	released := time.Now()
	for _, l := range leases {
		require.NoError(t, l.Release(ctx))
	}
	for range clients {
		select {
		case err := <-got:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("a waiter was not granted its lease within 10s of the release")
		}
	}
	t.Logf("all %d waiters granted within %s of the releases", clients, time.Since(released).Round(time.Millisecond))
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		return listenSlotsHeld(t, pool, "slots-waiter-") == 0, nil
	}, "the slots are still held with no waiter")
}

// A client opens no LISTEN connection while every listen slot is taken: a
// fleet whose clients each opened one only to learn that, at their first
// waits, spent the server on backend starts (200 clients on 2 cores:
// acquire p99 0.8 to 1.5 s against 0.13 s without LISTEN). It asks on its
// pool instead, at most once a second while its waiters poll, and listens
// once a slot is free.
func TestNoListenConnectionWithoutFreeSlot(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	holder := newClient(t, pool, leasetable.Config{Owner: "noconn-holder", TTL: time.Hour})
	listenConns := func(owner string) int {
		return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbaton lease listener ' || $1`, owner)
	}
	wait := func(c *leasetable.Client, name string) (<-chan error, *leasetable.Lease) {
		l, err := holder.TryAcquire(ctx, name)
		require.NoError(t, err)
		return acquireThenRelease(ctx, c, name), l
	}
	first := newClient(t, pool, leasetable.Config{Owner: "noconn-first", TTL: time.Hour, PollInterval: time.Hour, ListenSlots: 1})
	firstGot, firstLease := wait(first, "noconn/1")
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) { return listenSlotsHeld(t, pool, "noconn-first") == 1, nil },
		"the first waiting client holds no slot")

	waits := make(chan string, 10)
	second := newClient(t, pool, leasetable.Config{Owner: "noconn-second", TTL: time.Hour, PollInterval: time.Hour, ListenSlots: 1,
		Logger: logTo(waits)})
	secondGot, secondLease := wait(second, "noconn/2")
	<-waits
	// Two seconds of waiting: no LISTEN connection opens (the client asks
	// for a slot only when a waiter subscribes), and the waiter is not
	// served while the lease is held.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		require.Zero(t, listenConns("noconn-second"), "a client opened a LISTEN connection although no slot was free")
		select {
		case <-secondGot:
			t.Fatal("the second waiter returned while the lease was held")
		case <-time.After(50 * time.Millisecond):
		}
	}
	// Released: the polling waiter is served.
	require.NoError(t, secondLease.Release(ctx))
	select {
	case err := <-secondGot:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the slotless waiter was not granted the lease within 10s of its release")
	}
	require.NoError(t, firstLease.Release(ctx))
	require.NoError(t, <-firstGot)
}

// A listen slot is freed with its connection: a client whose LISTEN
// backend dies leaves no slot behind, and its waiter is still served.
func TestListenSlotFreedWithItsConnection(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	holder := newClient(t, pool, leasetable.Config{Owner: "slotdead-holder", TTL: time.Hour})
	l, err := holder.TryAcquire(ctx, "slotdead")
	require.NoError(t, err)
	waits := make(chan string, 1)
	c := newClient(t, pool, leasetable.Config{Owner: "slotdead-waiter", TTL: time.Hour, ListenSlots: 1, Logger: logTo(waits)})
	got := acquireThenRelease(ctx, c, "slotdead")
	<-waits
	slotHolder := func() (pid int) {
		_ = pool.QueryRow(ctx, `SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.classid = 1885495924
			AND l.objid = 0 AND l.objsubid = 2 AND l.granted`).Scan(&pid)
		return pid
	}
	var dead int
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) { dead = slotHolder(); return dead != 0, nil },
		"the waiting client holds no slot")
	env.Terminate(t, uint32(dead))
	// The dead backend's slot is free: nobody, or the client's new LISTEN
	// connection, holds it.
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) { return slotHolder() != dead, nil },
		"the dead connection's slot is still held")
	require.NoError(t, l.Release(ctx))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not granted the lease after its LISTEN connection died and the lease was released")
	}
}

// The LISTEN connection is a connection of its own, opened with the pool's
// settings and hooks: it does not take one of the pool's warm connections
// (whose replacement would start a cold backend that compiles pgbaton's
// functions again), and credentials made per connection by BeforeConnect
// work for it too.
func TestListenerLeavesThePoolItsConnections(t *testing.T) {
	d := env.DB(t)
	var connects atomic.Int32
	pool := d.Pool(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 2
		cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
			connects.Add(1)
			return nil
		}
	})
	ctx := pgtest.Context(t, time.Minute)
	holder := newClient(t, d.Pool(t), leasetable.Config{Owner: "warm-holder", TTL: time.Hour})
	l, err := holder.TryAcquire(ctx, "warm")
	require.NoError(t, err)
	waits := make(chan string, 1)
	c := newClient(t, pool, leasetable.Config{Owner: "warm-waiter", TTL: time.Hour, Logger: logTo(waits)})
	// Both of the pool's connections, open.
	a, err := pool.Acquire(ctx)
	require.NoError(t, err)
	b, err := pool.Acquire(ctx)
	require.NoError(t, err)
	a.Release()
	b.Release()
	require.EqualValues(t, 2, pool.Stat().TotalConns())
	before := connects.Load()

	got := make(chan error, 1)
	go func() {
		l2, err := c.Acquire(ctx, "warm")
		if err == nil {
			err = l2.Release(ctx)
		}
		got <- err
	}()
	<-waits
	require.Equal(t, 1, pgtest.Count(t, d.Pool(t), `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbaton lease listener warm-waiter'`))
	require.EqualValues(t, 2, pool.Stat().TotalConns(), "the pool lost a connection to the listener")
	require.Equal(t, before+1, connects.Load(), "the listener's connection did not run the pool's BeforeConnect")
	require.NoError(t, l.Release(ctx))
	require.NoError(t, <-got)
}

// Close frees the client's listen slot before it returns. The slot is a
// session advisory lock of the LISTEN backend, and a backend whose
// connection is only closed lets go of its locks once it has finished
// exiting, after Close returned (CI found one left in pg_locks after
// Close). The LISTEN backends here have temporary tables to drop on exit,
// which the server does before it releases their locks: a slot left to
// the exit is still held when Close returns. Close comes while the
// listener is idle, and while a statement of the listener runs (held up
// by a row lock until Close has begun): cancelling that statement would
// close the connection.
func TestCloseFreesListenSlot(t *testing.T) {
	for _, inFlight := range []bool{false, true} {
		t.Run(fmt.Sprintf("statement_in_flight=%v", inFlight), func(t *testing.T) {
			testCloseFreesListenSlot(t, inFlight)
		})
	}
}

func testCloseFreesListenSlot(t *testing.T, inFlight bool) {
	stopped := make(chan struct{}, 1)
	leasetable.SetCloseGrace(t, 10*time.Second, func() {
		select {
		case stopped <- struct{}{}:
		default: // told already
		}
	})
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	slowExit := d.Pool(t, func(cfg *pgxpool.Config) {
		cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			if conn.Config().RuntimeParams["application_name"] != "pgbaton lease listener close-waiter" {
				return nil
			}
			_, err := conn.Exec(ctx, `DO $$ BEGIN
				FOR i IN 1..300 LOOP EXECUTE format('CREATE TEMP TABLE slow_exit_%s (a int PRIMARY KEY, b text)', i); END LOOP;
			END $$`)
			return err
		}
	})
	holder := newClient(t, pool, leasetable.Config{Owner: "close-holder", TTL: time.Hour})
	l, err := holder.TryAcquire(ctx, "close-slot")
	require.NoError(t, err)
	waits := make(chan string, 1)
	// Closed by the test; newClient's cleanup would close it again, and
	// a failed test leaves nothing open either way.
	c := newClient(t, slowExit, leasetable.Config{Owner: "close-waiter", TTL: time.Hour, Logger: logTo(waits)})
	wait := func() (cancel func(), got <-chan error) {
		wctx, cancel := context.WithCancel(ctx)
		ch := make(chan error, 1)
		go func() {
			_, err := c.Acquire(wctx, "close-slot")
			ch <- err
		}()
		<-waits
		return cancel, ch
	}
	// The first wait polls (the slow LISTEN connection is not up in
	// time) and leaves the connection listening; the second registers.
	cancel, got := wait()
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) { return listenSlotsHeld(t, pool, "close-waiter") == 1, nil },
		"the waiting client does not listen")
	cancel()
	require.ErrorIs(t, <-got, context.Canceled)
	cancel, got = wait()
	pid := pgtest.Count(t, pool, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE application_name = 'pgbaton lease listener close-waiter'`)
	var block pgx.Tx
	if inFlight {
		// The waiter's registration is removed by the listener: hold
		// its row so that the removal waits.
		const registered = `FROM pgbaton.lease_waiter WHERE starts_with(waiter, 'close-waiter/')`
		pgtest.Eventually(t, 10*time.Second, func() (bool, error) { return pgtest.Count(t, pool, `SELECT count(*) `+registered) == 1, nil },
			"the waiter is not registered")
		block, err = pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = block.Rollback(ctx) }()
		_, err = block.Exec(ctx, `SELECT 1 `+registered+` FOR UPDATE`)
		require.NoError(t, err)
	}
	cancel()
	require.ErrorIs(t, <-got, context.Canceled)
	if inFlight {
		pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
			return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, pid) == 1, nil
		}, "the listener's removal of the registration does not wait for the row")
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close(ctx) }()
	<-stopped
	if inFlight {
		require.NoError(t, block.Rollback(ctx))
	}
	require.NoError(t, <-closed)
	require.Zero(t, pgtest.Count(t, pool, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1`, pid),
		"the LISTEN backend still holds its listen slot after Close returned")
	require.NoError(t, l.Release(ctx))
}

// A client that found a listen slot free on its pool and finds every
// slot taken once its LISTEN connection is open (the clients of a fleet
// that saw a slot free at about the same time all connect, and one gets
// it) closes that connection before LISTEN and before its probe, a NOTIFY
// that signals every listening backend of the database; its waiter polls
// and gets its lease.
func TestListenSlotTakenMeanwhileSendsNoProbe(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	opened, taken := make(chan struct{}, 1), make(chan struct{})
	leasetable.SetListenOpened(t, func() {
		select {
		case opened <- struct{}{}:
		default: // a later connection: the slot is taken already
		}
		<-taken
	})
	letGo := sync.OnceFunc(func() { close(taken) })
	watch := listenConn(t, ctx, pool)
	holder := newClient(t, pool, leasetable.Config{Owner: "raced-holder", TTL: time.Hour, NoListen: true})
	waiter := newClient(t, pool, leasetable.Config{Owner: "raced", TTL: time.Hour, ListenSlots: 1, PollInterval: 100 * time.Millisecond})
	// Before the clients close (cleanups run last first): a test that
	// failed early must not leave the listener stopped in the hook.
	t.Cleanup(letGo)
	held, err := holder.Acquire(ctx, "raced")
	require.NoError(t, err)
	got := acquireThenRelease(ctx, waiter, "raced")

	<-opened // the pool found the slot free; now someone else takes it
	slot, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer slot.Release()
	_, err = slot.Exec(ctx, "SELECT pg_advisory_lock(1885495924, 0)")
	require.NoError(t, err)
	defer slot.Exec(context.Background(), "SELECT pg_advisory_unlock_all()") //nolint:errcheck // the connection goes back to the pool
	letGo()
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		return pgtest.Count(t, pool, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgbaton lease listener raced%'") == 0, nil
	}, "the LISTEN connection that found no slot closes")
	require.NoError(t, held.Release(ctx))
	require.NoError(t, <-got, "the waiter polls and gets the lease")

	// Notifications arrive in commit order: a probe sent before the
	// connection closed comes before this marker.
	_, err = pool.Exec(ctx, "SELECT pg_notify('pgbaton_lease', 'marker')")
	require.NoError(t, err)
	var probes []string
	for {
		n, err := watch.WaitForNotification(ctx)
		require.NoError(t, err)
		if n.Payload == "marker" {
			break
		}
		if strings.Contains(n.Payload, "probe/") {
			probes = append(probes, n.Payload)
		}
	}
	assert.Empty(t, probes, "no probe from a connection that found every slot taken")
	assert.Zero(t, listenSlotsHeld(t, pool, "raced"))
}
