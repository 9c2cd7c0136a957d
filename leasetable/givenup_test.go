package leasetable_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// TestWaitsGivenUpCloseNoPoolConnection: a wait whose context ends while
// one of its statements is on the wire leaves the pool's connections
// open. pgx closes a connection whose statement's context ends mid-flight
// (it cannot tell where the protocol stands), so a statement run on the
// caller's context costs the pool a connection, and the client a new one,
// at every wait given up at such an instant: in a fleet of 500 clients on
// a loaded server, about one a client in each run. Every round trip here
// takes 40 ms (a slow link), so the deadlines, spread over 0–1 s, end
// inside every statement an Acquire, a ClaimWait and a Semaphore's
// acquisition send while they wait, including the waiter's registration,
// the listen-slot question and a lease session's opening.
func TestWaitsGivenUpCloseNoPoolConnection(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	d := env.DB(t)
	holder := newClient(t, d.Pool(t), leasetable.Config{Owner: "holder"})
	l, err := holder.Acquire(ctx, "busy")
	require.NoError(t, err)
	defer l.Release(ctx)
	sl, err := holder.Semaphore(ctx, "slots", 1)
	require.NoError(t, err)
	defer sl.Release(ctx)

	var closed atomic.Int64
	pool, proxy := env.ProxiedPool(t, d, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 2
		cfg.BeforeClose = func(*pgx.Conn) { closed.Add(1) }
	})
	waiter := newClient(t, pool, leasetable.Config{Owner: "waiter", TTL: 3 * time.Second})
	proxy.SetLatency(20 * time.Millisecond) // each way

	calls := []struct {
		name string
		wait func(ctx context.Context) error
	}{
		{"Acquire", func(ctx context.Context) error { _, err := waiter.Acquire(ctx, "busy"); return err }},
		{"ClaimWait", func(ctx context.Context) error { _, err := waiter.ClaimWait(ctx, "empty", 1); return err }},
		{"Semaphore", func(ctx context.Context) error { _, err := waiter.Semaphore(ctx, "slots", 1); return err }},
	}
	const rounds = 12
	for i := range rounds {
		for j, call := range calls {
			limit := time.Duration((i*83+j*29)%1000) * time.Millisecond
			cctx, cancel := context.WithTimeout(ctx, limit)
			err := call.wait(cctx)
			cancel()
			require.Truef(t, errors.Is(err, context.DeadlineExceeded), "%s with a %s deadline: %v", call.name, limit, err)
		}
	}
	require.Zero(t, closed.Load(), "pool connections closed by %d waits given up", rounds*len(calls))
}
