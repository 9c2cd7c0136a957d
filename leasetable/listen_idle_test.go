package leasetable_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// A client listens only while it has waiters. Every NOTIFY signals every
// listening backend of the database, whichever channel it listens on, and
// each of them sends the notification to its client: with one LISTEN per
// client a fleet of 200 spent its server CPU on deliveries nobody waited
// for (bench/RESULTS.md, "Fleet: 200 clients"). Once its last waiter has
// gone, the client's LISTEN backend stops listening (UNLISTEN) and frees
// its listen slot, and the next wait listens again before it looks at the
// lease, so no release is missed.
func TestListenerStopsListeningWithoutWaiters(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	holder := newClient(t, pool, leasetable.Config{Owner: "holder", TTL: time.Minute})
	// Only a notification can wake the waiter in time.
	c := newClient(t, pool, leasetable.Config{Owner: "idle-waiter", TTL: time.Hour, PollInterval: time.Hour})
	listening := func() bool { return listenSlotsHeld(t, pool, "idle-waiter") > 0 }
	for round := range 2 {
		l, err := holder.TryAcquire(ctx, "x")
		require.NoError(t, err)
		got := make(chan error, 1)
		go func() {
			l2, err := c.Acquire(ctx, "x")
			if err == nil {
				err = l2.Release(ctx)
			}
			got <- err
		}()
		pgtest.Eventually(t, 10*time.Second, func() (bool, error) { return listening(), nil }, "round %d: the waiter's client does not listen", round)
		require.NoError(t, l.Release(ctx))
		select {
		case err := <-got:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the waiter was not woken by the release", round)
		}
		pgtest.Eventually(t, 10*time.Second, func() (bool, error) { return !listening(), nil },
			"round %d: the client still listens with no waiter", round)
	}
}
