package advisory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/metertest"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// meter is an SDK MeterProvider read on demand.
type meter struct {
	t *testing.T
	metertest.Provider
}

func newMeter(t *testing.T) *meter { return &meter{t: t, Provider: metertest.New(t)} }

func (m *meter) collect() map[string]metricdata.Aggregation { return m.Collect(m.t) }

// sum adds up the points of the int64 sum called name whose
// attributes include every one of match.
func (m *meter) sum(name string, match ...attribute.KeyValue) int64 {
	m.t.Helper()
	var points []metricdata.DataPoint[int64]
	switch d := m.collect()[name].(type) {
	case metricdata.Sum[int64]:
		points = d.DataPoints
	case nil:
		return 0
	default:
		m.t.Fatalf("%s is a %T", name, d)
	}
	var n int64
	for _, dp := range points {
		if hasAll(dp.Attributes, match) {
			n += dp.Value
		}
	}
	return n
}

// count is the number of values recorded in histogram name with match.
func (m *meter) count(name string, match ...attribute.KeyValue) uint64 {
	m.t.Helper()
	d, ok := m.collect()[name].(metricdata.Histogram[float64])
	if !ok {
		return 0
	}
	var n uint64
	for _, dp := range d.DataPoints {
		if hasAll(dp.Attributes, match) {
			n += dp.Count
		}
	}
	return n
}

// names lists the pgbaton.name values seen in any data point.
func (m *meter) names() []string {
	m.t.Helper()
	seen := map[string]bool{}
	var out []string
	add := func(s attribute.Set) {
		if v, ok := s.Value("pgbaton.name"); ok && !seen[v.AsString()] {
			seen[v.AsString()] = true
			out = append(out, v.AsString())
		}
	}
	for _, d := range m.collect() {
		switch d := d.(type) {
		case metricdata.Sum[int64]:
			for _, dp := range d.DataPoints {
				add(dp.Attributes)
			}
		case metricdata.Histogram[float64]:
			for _, dp := range d.DataPoints {
				add(dp.Attributes)
			}
		}
	}
	return out
}

func hasAll(s attribute.Set, match []attribute.KeyValue) bool {
	for _, kv := range match {
		if v, ok := s.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

func result(r string) attribute.KeyValue { return attribute.String("pgbaton.result", r) }
func cause(c string) attribute.KeyValue  { return attribute.String("pgbaton.cause", c) }

func TestMetricsContention(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	d := env.DB(t)
	m := newMeter(t)
	pool := d.Pool(t)
	a := newLocker(t, pool, advisory.Config{MeterProvider: m.MeterProvider})
	b := newLocker(t, pool, advisory.Config{MeterProvider: m.MeterProvider})

	lk, err := a.TryLock(ctx, advisory.Name("metrics:contended"))
	require.NoError(t, err)
	_, err = b.TryLock(ctx, advisory.Name("metrics:contended"))
	require.ErrorIs(t, err, advisory.ErrLocked)
	// Held in this process: the same Locker refuses without the server.
	_, err = a.TryLock(ctx, advisory.Name("metrics:contended"))
	require.ErrorIs(t, err, advisory.ErrLocked)
	// A wait that runs out while the key is held is contention too.
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = b.Lock(wctx, advisory.Name("metrics:contended"))
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// Bad input is not an attempt.
	_, err = a.TryLock(ctx, advisory.Name(""))
	require.Error(t, err)

	require.EqualValues(t, 1, m.sum("pgbaton.acquire.attempts", result("acquired")))
	require.EqualValues(t, 3, m.sum("pgbaton.acquire.attempts", result("held")))
	require.EqualValues(t, 0, m.sum("pgbaton.acquire.attempts", result("error")))
	require.EqualValues(t, 4, m.count("pgbaton.acquire.wait.duration"))
	require.EqualValues(t, 1, m.sum("pgbaton.held"))
	// The session of b's wait is closed after Lock returns (the server must
	// first give up waiting): a and b then each have one.
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) { return m.sum("pgbaton.sessions") == 2, nil },
		"a and b each have a session")
	require.Empty(t, m.names(), "names only with Config.MetricNames")

	require.NoError(t, lk.Unlock(ctx))
	require.EqualValues(t, 0, m.sum("pgbaton.held"))
	require.EqualValues(t, 1, m.count("pgbaton.hold.duration"))
	require.EqualValues(t, 0, m.sum("pgbaton.lost"), "an Unlock is no loss")
}

func TestMetricsLossAfterTerminate(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	d := env.DB(t)
	admin := adminPool(t)
	m := newMeter(t)
	l := newLocker(t, d.Pool(t), advisory.Config{MeterProvider: m.MeterProvider, PingInterval: 50 * time.Millisecond, PingTimeout: time.Second})

	lk, err := l.TryLock(ctx, advisory.Int64(7001))
	require.NoError(t, err)
	shared, err := l.TryRLock(ctx, advisory.Int64(7002))
	require.NoError(t, err)
	require.EqualValues(t, 2, m.sum("pgbaton.held"))

	env.Terminate(t, holderPID(t, admin, d, 7001))
	select {
	case <-lk.Done():
	case <-ctx.Done():
		t.Fatal("lock not lost after its backend was terminated")
	}
	<-shared.Done()
	require.ErrorIs(t, lk.Err(), advisory.ErrLockLost)

	require.EqualValues(t, 2, m.sum("pgbaton.lost", cause(advisory.CauseSession)))
	require.EqualValues(t, 0, m.sum("pgbaton.held"))
	require.EqualValues(t, 2, m.count("pgbaton.hold.duration"))
	require.GreaterOrEqual(t, m.sum("pgbaton.renew.failures"), int64(1), "the ping that found the session dead")
	require.EqualValues(t, 0, m.sum("pgbaton.sessions"))
	// Unlock after the loss reports it and records nothing more.
	require.ErrorIs(t, lk.Unlock(ctx), advisory.ErrLockLost)
	require.EqualValues(t, 2, m.sum("pgbaton.lost"))
	require.EqualValues(t, 2, m.count("pgbaton.hold.duration"))

	// The next lock opens a new session.
	lk, err = l.TryLock(ctx, advisory.Int64(7001))
	require.NoError(t, err)
	require.EqualValues(t, 1, m.sum("pgbaton.sessions"))
	require.NoError(t, l.Close(ctx))
	require.EqualValues(t, 1, m.sum("pgbaton.lost", cause(advisory.CauseClosed)), "held when the Locker closed")
	require.EqualValues(t, 0, m.sum("pgbaton.held"))
	require.EqualValues(t, 0, m.sum("pgbaton.sessions"))
	require.ErrorIs(t, lk.Err(), advisory.ErrLockLost)
}

func TestMetricsNames(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	d := env.DB(t)
	m := newMeter(t)
	l := newLocker(t, d.Pool(t), advisory.Config{MeterProvider: m.MeterProvider, MetricNames: true})
	for _, k := range []advisory.Key{advisory.Name("job:export"), advisory.Int64(-42), advisory.Pair(3, -4)} {
		require.NoError(t, l.RunExclusive(ctx, k, func(context.Context) error { return nil }, advisory.RunOptions{}))
	}
	require.ElementsMatch(t, []string{"job:export", "-42", "3,-4"}, m.names())
	require.EqualValues(t, 1, m.sum("pgbaton.acquire.attempts", result("acquired"), attribute.String("pgbaton.name", "-42")))
	require.EqualValues(t, 3, m.count("pgbaton.hold.duration"))
}

func TestMetricsErrorResult(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	d := env.DB(t)
	m := newMeter(t)
	l := newLocker(t, d.Pool(t), advisory.Config{MeterProvider: m.MeterProvider, MaxLocks: 1})
	lk, err := l.TryLock(ctx, advisory.Int64(1))
	require.NoError(t, err)
	_, err = l.TryLock(ctx, advisory.Int64(2))
	require.True(t, errors.Is(err, advisory.ErrLockTableFull), err)
	require.EqualValues(t, 1, m.sum("pgbaton.acquire.attempts", result("error")))
	require.NoError(t, lk.Unlock(ctx))
}
