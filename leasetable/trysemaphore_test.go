package leasetable_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// TrySemaphore takes a free permit or says at once that none is free for
// it: every permit held, or a waiter ahead of it in the queue.
func TestTrySemaphore(t *testing.T) {
	ctx := pgtest.Context(t, 30*time.Second)
	pool := env.DB(t).Pool(t)
	a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: time.Minute})
	b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: time.Minute})

	p1, err := a.TrySemaphore(ctx, "exports", 2)
	require.NoError(t, err)
	_, err = b.TrySemaphore(ctx, "exports", 2)
	require.NoError(t, err)
	_, err = b.TrySemaphore(ctx, "exports", 2)
	require.ErrorIs(t, err, leasetable.ErrHeld, "both permits held")
	_, err = a.TrySemaphore(ctx, "exports", 3)
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "every caller passes the same count")

	// A waiter queues; a permit given back goes to it, not to a TrySemaphore.
	waited := make(chan error, 1)
	go func() {
		_, err := b.Semaphore(ctx, "exports", 2)
		waited <- err
	}()
	queued(t, ctx, pool, "exports", 1)
	require.NoError(t, p1.Release(ctx))
	require.NoError(t, <-waited)
	_, err = a.TrySemaphore(ctx, "exports", 2)
	require.ErrorIs(t, err, leasetable.ErrHeld)
}
