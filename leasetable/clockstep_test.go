package leasetable_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/migrations"
)

// fakeClockPool starts a migrated cluster whose wall clock the test steps
// (libfaketime) and returns it with a pool on it.
func fakeClockPool(t *testing.T, ctx context.Context) (*pgcluster.Cluster, *pgxpool.Pool) {
	t.Helper()
	cl := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true, FakeClock: true})
	require.NoError(t, migrations.UpURL(ctx, cl.URL("postgres")))
	return cl, pgtest.Pool(t, cl.URL("postgres"))
}

// errorLog is a slog handler that keeps the "error" of every record, by
// message.
type errorLog struct {
	mu  sync.Mutex
	got map[string][]error
}

func newErrorLog() *errorLog { return &errorLog{got: map[string][]error{}} }

func (h *errorLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *errorLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && a.Key == "error" {
			h.mu.Lock()
			h.got[r.Message] = append(h.got[r.Message], err)
			h.mu.Unlock()
		}
		return true
	})
	return nil
}
func (h *errorLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *errorLog) WithGroup(string) slog.Handler      { return h }

// logged reports whether some record carried an error wrapping target.
func (h *errorLog) logged(target error) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, errs := range h.got {
		for _, err := range errs {
			if errors.Is(err, target) {
				return true
			}
		}
	}
	return false
}

// renewals returns a channel that gets a value after every successful
// keep-alive of l's session.
func renewals(l *leasetable.Lease) <-chan struct{} {
	ch := make(chan struct{}, 100)
	l.OnRenew(func(context.Context) {
		select {
		case ch <- struct{}{}:
		default:
		}
	})
	return ch
}

// The server's wall clock steps forward by more than the TTL (an NTP step,
// a VM resume): the database lets A's lease go at once, and B takes it.
// A must learn of it at its next keep-alive, which sees the server's clock
// advance 30s more than A's monotonic clock did, not at its local deadline
// seconds later; the step is logged and counted.
func TestClockStepForwardEndsLeasesAtNextKeepalive(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	cl, pool := fakeClockPool(t, ctx)
	logs := newErrorLog()
	m := newMeter(t)
	const ttl = 10 * time.Second
	a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: ttl, Logger: slog.New(logs), MeterProvider: m})
	b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: ttl})

	held, err := a.TryAcquire(ctx, "job")
	require.NoError(t, err)
	deadline := held.Deadline()

	require.NoError(t, cl.StepClock(30*time.Second))
	stepped := time.Now()
	taken, err := b.TryAcquire(ctx, "job")
	require.NoError(t, err, "the database let A's lease go at the step")
	require.Greater(t, taken.Token(), held.Token())

	select {
	case <-held.Done():
	case <-time.After(time.Until(deadline) + 10*time.Second):
		t.Fatal("A was never told")
	}
	require.True(t, time.Now().Before(deadline), "A was told only at its local deadline, %s after the step", time.Since(stepped))
	told := time.Since(stepped)
	t.Logf("A told %s after the step (RenewInterval %s)", told, a.Config().RenewInterval)
	// The next keep-alive is due at most RenewInterval after the step; the
	// rest is its round trip on a loaded machine.
	assert.Less(t, told, a.Config().RenewInterval+2*time.Second)
	require.ErrorIs(t, held.Err(), leasetable.ErrLeaseLost)
	require.ErrorIs(t, held.Err(), leasetable.ErrClockStep)
	assert.True(t, logs.logged(leasetable.ErrClockStep), "the step is logged under \"error\"")
	assert.Equal(t, int64(1), m.sum(t, "pgbaton.lost", "pgbaton.cause", leasetable.CauseClockStep))
	assert.Equal(t, int64(1), m.sum(t, "pgbaton.clock.steps", "", ""))
	require.NoError(t, taken.Release(ctx))
}

// waitRenewals waits for n successful keep-alives from ch.
func waitRenewals(t *testing.T, ch <-chan struct{}, n int, within time.Duration) {
	t.Helper()
	timeout := time.After(within)
	for i := range n {
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("%d of %d keep-alives within %s", i, n, within)
		}
	}
}

// A forward step within the safety margin is absorbed; a larger one that
// a keep-alive still finds the session alive after is reported (logged,
// counted), but costs no lease: the database let none of the session's
// leases go, and B still cannot take them.
func TestClockStepForwardKeptAliveLosesNothing(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	cl, pool := fakeClockPool(t, ctx)
	logs := newErrorLog()
	m := newMeter(t)
	a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: 10 * time.Second, Logger: slog.New(logs), MeterProvider: m})
	b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: 10 * time.Second})
	held, err := a.TryAcquire(ctx, "job")
	require.NoError(t, err)
	interval := a.Config().RenewInterval

	require.NoError(t, cl.StepClock(a.Config().SafetyMargin/2))
	// The second keep-alive from now was sent after the step.
	waitRenewals(t, renewals(held), 2, 3*interval+5*time.Second)
	assert.Zero(t, m.sum(t, "pgbaton.clock.steps", "", ""), "a step within the safety margin is absorbed")

	// Less than TTL - RenewInterval - SafetyMargin, so the session outlives it.
	require.NoError(t, cl.StepClock(4*time.Second))
	waitRenewals(t, renewals(held), 2, 3*interval+5*time.Second)
	assert.Equal(t, int64(1), m.sum(t, "pgbaton.clock.steps", "", ""))
	assert.True(t, logs.logged(leasetable.ErrClockStep))
	require.NoError(t, held.Err(), "the session was kept alive across the step")
	_, err = b.TryAcquire(ctx, "job")
	require.ErrorIs(t, err, leasetable.ErrHeld)
	require.NoError(t, held.Release(ctx))
}

// A step back of the server's clock lengthens leases in the database, but
// never a holder's hold: keep-alives go on and report no step, and once
// they stop A counts its lease lost at its local deadline, by its
// monotonic clock, and gives it back, so B need not wait the 30s that the
// database's clock now adds to the expiry.
func TestClockStepBackNeverKeepsALeasePastItsDeadline(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	cl, pool := fakeClockPool(t, ctx)
	logs := newErrorLog()
	const ttl = 3 * time.Second
	a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: ttl, Logger: slog.New(logs)})
	b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: ttl})
	held, err := a.TryAcquire(ctx, "job")
	require.NoError(t, err)

	require.NoError(t, cl.StepClock(-30*time.Second))
	waitRenewals(t, renewals(held), 2, 3*a.Config().RenewInterval+5*time.Second)
	require.NoError(t, held.Err(), "keep-alives go on across a step back")
	assert.False(t, logs.logged(leasetable.ErrClockStep), "a step back is no forward step")

	pgtest.BlockKeepalives(t, pool, "a")
	awaitKeepaliveBlocked(t, pool, held)
	deadline := held.Deadline()
	require.NoError(t, held.Err())
	_, err = b.TryAcquire(ctx, "job")
	require.ErrorIs(t, err, leasetable.ErrHeld, "B cannot take it while A holds it")

	// Past the deadline A never counts the lease held, whenever its timer
	// runs.
	<-time.After(time.Until(deadline))
	require.ErrorIs(t, held.Err(), leasetable.ErrLeaseLost)
	require.NotErrorIs(t, held.Err(), leasetable.ErrClockStep)
	var got *leasetable.Lease
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		got, err = b.TryAcquire(ctx, "job")
		if errors.Is(err, leasetable.ErrHeld) {
			return false, nil
		}
		return err == nil, err
	}, "B did not get the lease A lost")
	t.Logf("B got it %s after A's deadline", time.Since(deadline))
	require.NoError(t, got.Release(ctx))
}
