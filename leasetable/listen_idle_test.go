package leasetable_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// A client listens only while it has waiters. Every NOTIFY signals every
// listening backend of the database, whichever channel it listens on, and
// each of them sends the notification to its client: with one LISTEN per
// client a fleet of 200 spent its server CPU on deliveries nobody waited
// for (bench/RESULTS.md, "Fleet: 200 clients"). Once its last waiter has
// gone, the client's LISTEN backend stops listening (UNLISTEN) but keeps
// its listen slot and connection, so the next wait listens again on the
// same backend, before it looks at the lease, and no release is missed.
func TestListenerStopsListeningWithoutWaiters(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	holder := newClient(t, pool, leasetable.Config{Owner: "holder", TTL: time.Minute})
	// Only a notification can wake the waiter in time.
	c := newClient(t, pool, leasetable.Config{Owner: "idle-waiter", TTL: time.Hour, PollInterval: time.Hour})
	listener := func() (pid int, unlistened bool) {
		_ = pool.QueryRow(ctx, `SELECT pid, query LIKE '%UNLISTEN%' FROM pg_stat_activity
			WHERE application_name = 'pgbaton lease listener idle-waiter'`).Scan(&pid, &unlistened)
		return pid, unlistened
	}
	var pids []int
	for round := range 2 {
		l, err := holder.TryAcquire(ctx, "x")
		require.NoError(t, err)
		got := acquireThenRelease(ctx, c, "x")
		pgtest.Eventually(t, 10*time.Second, func() (bool, error) { return listenSlotsHeld(t, pool, "idle-waiter") == 1, nil },
			"round %d: the waiter's client does not listen", round)
		require.NoError(t, l.Release(ctx))
		select {
		case err := <-got:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the waiter was not woken by the release", round)
		}
		pgtest.Eventually(t, 10*time.Second, func() (bool, error) { _, un := listener(); return un, nil },
			"round %d: the client still listens with no waiter", round)
		pid, _ := listener()
		pids = append(pids, pid)
		require.Equal(t, 1, listenSlotsHeld(t, pool, "idle-waiter"), "round %d: the slot is kept between waits", round)
	}
	require.Equal(t, pids[0], pids[1], "the second wait listens on the first wait's connection")
}

// A client frees its listen slot, and closes the LISTEN connection that
// holds it, once nobody has waited for listener.SlotKeep: clients that stopped
// waiting leave the slots to those that wait.
func TestListenSlotFreedAfterWaitsStop(t *testing.T) {
	leasetable.SetSlotKeep(t, 500*time.Millisecond)
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	holder := newClient(t, pool, leasetable.Config{Owner: "keep-holder", TTL: time.Minute})
	c := newClient(t, pool, leasetable.Config{Owner: "keep-waiter", TTL: time.Hour, PollInterval: time.Hour})
	l, err := holder.TryAcquire(ctx, "keep")
	require.NoError(t, err)
	got := acquireThenRelease(ctx, c, "keep")
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) { return listenSlotsHeld(t, pool, "keep-waiter") == 1, nil },
		"the waiter's client does not listen")
	require.NoError(t, l.Release(ctx))
	require.NoError(t, <-got)
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbaton lease listener keep-waiter'`) == 0, nil
	}, "the LISTEN connection is still open with no waiter for longer than SlotKeep")
	require.Zero(t, listenSlotsHeld(t, pool, "keep-waiter"))
}

// A waiter granted its lease leaves its pool to its caller: the removal of
// its registration does not run on the pool beside the caller's next
// calls, where it made the pool open a second connection (a fleet of 200
// clients on 2 cores opened 325-403 connections in a 10s run against 209
// without LISTEN, and every backend start slowed the others). Each round
// here waits for a release, then renews and releases at once, as a job
// does: the pool (MaxConns 2) must never need its second connection, and
// no registration is left behind.
func TestWaitLeavesThePoolToTheCaller(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	own := d.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 2 })
	holder := newClient(t, pool, leasetable.Config{Owner: "holder", TTL: time.Minute})
	waiting := make(chan string, 1)
	// A TTL of an hour: no keep-alive of the session in the test's time.
	c := newClient(t, own, leasetable.Config{Owner: "busy-waiter", TTL: time.Hour, PollInterval: time.Hour, Logger: logTo(waiting)})
	const rounds = 30
	for round := range rounds {
		l, err := holder.TryAcquire(ctx, "p")
		require.NoError(t, err)
		got := make(chan error, 1)
		go func() {
			wl, err := c.Acquire(ctx, "p")
			if err == nil {
				err = wl.Renew(ctx)
			}
			if err == nil {
				err = wl.Release(ctx)
			}
			got <- err
		}()
		require.Equal(t, "p", <-waiting)
		require.NoError(t, l.Release(ctx))
		select {
		case err := <-got:
			require.NoError(t, err, "round %d", round)
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the waiter was not woken by the release", round)
		}
	}
	assert.Equal(t, int64(1), own.Stat().NewConnsCount(), "connections the waiter's pool opened in %d waits", rounds)
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		return pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_waiter") == 0, nil
	}, "waiter registrations left behind")
}
