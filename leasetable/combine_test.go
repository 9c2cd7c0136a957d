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
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// completeManyCounter counts the round trips that complete items
// (CompleteAndClaim's batch, Complete's statement) on a pool.
type completeManyCounter struct{ n *atomic.Int64 }

func (t completeManyCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pgbaton.complete_many(") {
		t.n.Add(1)
	}
	return ctx
}
func (completeManyCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (completeManyCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (t completeManyCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if strings.Contains(d.SQL, "pgbaton.complete_many(") {
		t.n.Add(1)
	}
}
func (completeManyCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestConcurrentCompleteAndClaimHandEachItemOnce: workers of one Client
// looping CompleteAndClaim on one group at the same time, their calls
// sent together, each get their own leases, and every item is handed out
// once and completed once. With context.Background the caller that finds
// a sender free sends on its own goroutine.
func TestConcurrentCompleteAndClaimHandEachItemOnce(t *testing.T) {
	t.Run("cancellable", func(t *testing.T) { handEachItemOnce(t, pgtest.Context(t, 2*time.Minute)) })
	t.Run("background", func(t *testing.T) { handEachItemOnce(t, context.Background()) })
}

func handEachItemOnce(t *testing.T, wctx context.Context) {
	ctx := pgtest.Context(t, 2*time.Minute)
	var sent atomic.Int64
	pool := env.DB(t).Pool(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 8
		cfg.ConnConfig.Tracer = completeManyCounter{&sent}
	})
	c := newClient(t, pool, leasetable.Config{Owner: "worker"})
	const items, workers = 400, 4
	names := make([]string, items)
	for i := range names {
		names[i] = fmt.Sprintf("item-%03d", i)
	}
	_, err := c.Register(ctx, "q", names...)
	require.NoError(t, err)

	var mu sync.Mutex
	handed := map[string]int{}
	var calls atomic.Int64
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			ls, err := c.Claim(ctx, "q", 1)
			for err == nil && len(ls) > 0 {
				mu.Lock()
				for _, l := range ls {
					handed[l.Name()]++
				}
				mu.Unlock()
				calls.Add(1)
				ls, err = c.CompleteAndClaim(wctx, "q", 1, ls...)
			}
			errs <- err
		})
	}
	wg.Wait()
	for range workers {
		require.NoError(t, <-errs)
	}
	require.Len(t, handed, items)
	for name, n := range handed {
		require.Equal(t, 1, n, "%s handed out %d times", name, n)
	}
	var left int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease WHERE lease_group = 'q'").Scan(&left))
	require.Zero(t, left, "items not completed")
	// How many calls share a round trip depends on the server's speed;
	// TestConcurrentCompleteAndClaimShareARoundTrip counts it exactly.
	t.Logf("%d calls, %d round trips", calls.Load(), sent.Load())
}

// holdTracer holds the CompleteAndClaim round trips on a pool at their
// start until release is closed, and counts them.
type holdTracer struct {
	sent    atomic.Int64
	started chan struct{} // a value per round trip held
	release chan struct{}
}

func (*holdTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (*holdTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (t *holdTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if len(d.Batch.QueuedQueries) > 0 && strings.Contains(d.Batch.QueuedQueries[0].SQL, "pgbaton.complete_many(") {
		t.sent.Add(1)
		t.started <- struct{}{}
		<-t.release
	}
	return ctx
}
func (*holdTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (*holdTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestConcurrentCompleteAndClaimShareARoundTrip: calls of one Client on
// one group that arrive while two round trips of the group are in flight
// go together in one, as River's completer commits many workers'
// completions at once; each still gets its own leases. Sent one call per
// round trip, 4 workers at batch 1 paid a commit per item, which on a
// server whose commits are slow made them slower than River. The tracer
// holds the first two round trips until the other calls have queued, so
// the count does not depend on the server's speed.
func TestConcurrentCompleteAndClaimShareARoundTrip(t *testing.T) {
	t.Run("cancellable", func(t *testing.T) { shareARoundTrip(t, pgtest.Context(t, time.Minute)) })
	t.Run("background", func(t *testing.T) { shareARoundTrip(t, context.Background()) })
}

func shareARoundTrip(t *testing.T, wctx context.Context) {
	ctx := pgtest.Context(t, time.Minute)
	tr := &holdTracer{started: make(chan struct{}, 8), release: make(chan struct{})}
	pool := env.DB(t).Pool(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 12
		cfg.ConnConfig.Tracer = tr
	})
	c := newClient(t, pool, leasetable.Config{Owner: "worker"})
	var release sync.Once
	free := func() { release.Do(func() { close(tr.release) }) }
	t.Cleanup(free) // before c closes: Close waits for what is held
	const calls, queued = 8, 6
	names := make([]string, 2*calls)
	for i := range names {
		names[i] = fmt.Sprintf("item-%02d", i)
	}
	_, err := c.Register(ctx, "q", names...)
	require.NoError(t, err)
	held, err := c.Claim(ctx, "q", calls)
	require.NoError(t, err)
	require.Len(t, held, calls)

	got := make([][]*leasetable.Lease, calls)
	errs := make([]error, calls)
	var wg sync.WaitGroup
	call := func(i int) {
		wg.Go(func() { got[i], errs[i] = c.CompleteAndClaim(wctx, "q", 1, held[i]) })
	}
	// Two calls, each its own round trip, held in flight.
	for i := range calls - queued {
		call(i)
		select {
		case <-tr.started:
		case <-time.After(20 * time.Second):
			t.Fatalf("round trip %d of a group not sent beside the others in flight", i+1)
		}
	}
	for i := calls - queued; i < calls; i++ {
		call(i)
	}
	pgtest.Eventually(t, 20*time.Second, func() (bool, error) {
		return leasetable.CombinedQueued(c, "q") == queued, nil
	}, "calls queued: %d, want %d", leasetable.CombinedQueued(c, "q"), queued)
	free()
	wg.Wait()

	seen := map[string]bool{}
	for i := range calls {
		require.NoError(t, errs[i], "call %d", i)
		require.Len(t, got[i], 1, "call %d", i)
		require.False(t, seen[got[i][0].Name()], "%s handed out twice", got[i][0].Name())
		seen[got[i][0].Name()] = true
	}
	require.Equal(t, int64(3), tr.sent.Load(),
		"%d calls queued behind two round trips in flight did not go together in one", queued)
	var left int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease WHERE lease_group = 'q'").Scan(&left))
	require.Equal(t, calls, left, "the finished items were not all completed")
}

// TestCompleteAndClaimGivenUpSettles: a CompleteAndClaim whose caller
// gives up while its round trip is on the wire returns at once; the reply,
// when it comes, completes the finished lease and gives back the claimed
// one, so nothing stays held by the worker.
func TestCompleteAndClaimGivenUpSettles(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	direct, victim, _, proxy := slowLinkWorker(t, ctx, "victim", "item-1", "item-2", "item-3")
	done, err := victim.Claim(ctx, "items", 1)
	require.NoError(t, err)
	require.Len(t, done, 1)

	giveUpWithReplyHeld(t, ctx, direct, proxy, "%complete_many%", func(ctx context.Context) error {
		_, err := victim.CompleteAndClaim(ctx, "items", 1, done...)
		return err
	}, func() bool { // done[0] completed, another claimed
		held := heldBy(t, direct, "victim")
		return len(held) == 1 && held[0] != done[0].Name()
	})
	pgtest.Eventually(t, 20*time.Second, func() (bool, error) {
		return len(heldBy(t, direct, "victim")) == 0, nil
	}, "rows still held by a caller that gave up: %v", heldBy(t, direct, "victim"))
	var left []string
	require.NoError(t, direct.QueryRow(ctx, "SELECT array_agg(name ORDER BY name) FROM pgbaton.lease WHERE lease_group = 'items'").Scan(&left))
	require.NotContains(t, left, done[0].Name(), "the finished item was not completed")
	require.Len(t, left, 2)
}

// overlapTracer counts the CompleteAndClaim round trips in flight on a
// pool at once. A round trip that starts alone waits (up to 2s) for a
// second one to start beside it, so that calls which may overlap do.
type overlapTracer struct {
	mu      sync.Mutex
	now     int
	most    int
	first   chan struct{} // closed when the first was in flight
	another chan struct{} // closed when two were in flight at once
}

type overlapKey struct{}

func (t *overlapTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (*overlapTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (t *overlapTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if len(d.Batch.QueuedQueries) == 0 || !strings.Contains(d.Batch.QueuedQueries[0].SQL, "pgbaton.complete_many(") {
		return ctx
	}
	t.mu.Lock()
	t.now++
	if t.most == 0 {
		close(t.first)
	}
	if t.now == 2 && t.most < 2 {
		close(t.another)
	}
	t.most = max(t.most, t.now)
	t.mu.Unlock()
	select {
	case <-t.another:
	case <-time.After(2 * time.Second):
	}
	return context.WithValue(ctx, overlapKey{}, true)
}
func (*overlapTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (t *overlapTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	if ctx.Value(overlapKey{}) != nil {
		t.mu.Lock()
		t.now--
		t.mu.Unlock()
	}
}

// TestLargeCompleteAndClaimCallsOverlap: calls that claim combine.Max (100)
// leases or more are not held back behind one another. With one round
// trip per group in flight at a time, 4 workers claiming 100 each ran
// their statements one after another on one server core, where raw pgx
// runs four at once: 0.80× raw pgx at batch 100 in bench/RESULTS.md.
// With context.Background a caller that would start a sender sends
// itself, and may find its call taken by another sender already.
func TestLargeCompleteAndClaimCallsOverlap(t *testing.T) {
	t.Run("cancellable", func(t *testing.T) { callsOverlap(t, pgtest.Context(t, time.Minute), 100) })
	t.Run("background", func(t *testing.T) { callsOverlap(t, context.Background(), 100) })
}

// TestSmallCompleteAndClaimCallsOverlap: calls that claim fewer than
// combine.Max leases in all go two round trips at a time, not one. With
// one in flight, 4 workers claiming 10 each from a queue of 1M items ran
// at 0.68-0.79x raw pgx (AMD EPYC, 2 cores), a server core idle while
// the one round trip was on the wire.
func TestSmallCompleteAndClaimCallsOverlap(t *testing.T) {
	t.Run("cancellable", func(t *testing.T) { callsOverlap(t, pgtest.Context(t, time.Minute), 10) })
	t.Run("background", func(t *testing.T) { callsOverlap(t, context.Background(), 10) })
}

func callsOverlap(t *testing.T, wctx context.Context, batch int) {
	ctx := pgtest.Context(t, time.Minute)
	tr := &overlapTracer{first: make(chan struct{}), another: make(chan struct{})}
	pool := env.DB(t).Pool(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 8
		cfg.ConnConfig.Tracer = tr
	})
	c := newClient(t, pool, leasetable.Config{Owner: "worker"})
	const workers = 4
	names := make([]string, 2*batch*workers)
	for i := range names {
		names[i] = fmt.Sprintf("item-%03d", i)
	}
	_, err := c.Register(ctx, "q", names...)
	require.NoError(t, err)
	held := make([][]*leasetable.Lease, workers)
	for w := range held {
		held[w], err = c.Claim(ctx, "q", batch)
		require.NoError(t, err)
		require.Len(t, held[w], batch)
	}

	// The first call is on the wire before the others are made: made at
	// once, all four could go in one round trip, as they should.
	got := make([][]*leasetable.Lease, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		if w == 1 {
			<-tr.first
		}
		wg.Go(func() { got[w], errs[w] = c.CompleteAndClaim(wctx, "q", batch, held[w]...) })
	}
	wg.Wait()
	seen := map[string]bool{}
	for w := range workers {
		require.NoError(t, errs[w])
		require.Len(t, got[w], batch)
		for _, l := range got[w] {
			require.False(t, seen[l.Name()], "%s handed out twice", l.Name())
			seen[l.Name()] = true
		}
		require.NoError(t, c.Complete(ctx, got[w]...))
	}
	tr.mu.Lock()
	most := tr.most
	tr.mu.Unlock()
	require.GreaterOrEqual(t, most, 2, "%d calls claiming %d each were sent one round trip at a time", workers, batch)
}
