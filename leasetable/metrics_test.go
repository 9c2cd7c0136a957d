package leasetable_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgbaton/pgbaton/internal/testkit/metertest"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// meter is an SDK meter provider whose metrics the test reads on demand.
type meter struct{ metertest.Provider }

func newMeter(t *testing.T) meter { return meter{metertest.New(t)} }

// points returns, for metric name, each data point's value (a count for
// histograms) with its attributes.
func (m meter) points(t *testing.T, name string) []point {
	t.Helper()
	var out []point
	switch d := m.Collect(t)[name].(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			out = append(out, point{dp.Attributes, dp.Value})
		}
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			out = append(out, point{dp.Attributes, int64(dp.Count)})
		}
	}
	return out
}

type point struct {
	attrs attribute.Set
	value int64
}

// sum adds the values of name's points whose attribute key equals value
// (every point when key is "").
func (m meter) sum(t *testing.T, name, key, value string) int64 {
	t.Helper()
	var n int64
	for _, p := range m.points(t, name) {
		if v, ok := p.attrs.Value(attribute.Key(key)); key == "" || ok && v.AsString() == value {
			n += p.value
		}
	}
	return n
}

func TestMetricsContentionAndRelease(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	m := newMeter(t)
	a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: time.Minute, MeterProvider: m})
	waiting := make(chan string, 1)
	b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: time.Minute, MeterProvider: m, Logger: logTo(waiting)})

	l, err := a.TryAcquire(ctx, "m")
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, "m")
	require.ErrorIs(t, err, leasetable.ErrHeld)
	// Gives up waiting: contention too. Cancelled once it waits (a short
	// deadline could expire in the attempt itself on a busy machine).
	short, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-waiting
		cancel()
	}()
	_, err = b.Acquire(short, "m")
	require.ErrorIs(t, err, context.Canceled)
	_, err = b.TryAcquire(ctx, "") // bad input is no attempt
	require.Error(t, err)

	assert.EqualValues(t, 1, m.sum(t, "pgbaton.acquire.attempts", "pgbaton.result", "acquired"))
	assert.EqualValues(t, 2, m.sum(t, "pgbaton.acquire.attempts", "pgbaton.result", "held"))
	assert.EqualValues(t, 0, m.sum(t, "pgbaton.acquire.attempts", "pgbaton.result", "error"))
	assert.EqualValues(t, 3, m.sum(t, "pgbaton.acquire.wait.duration", "", ""))
	assert.EqualValues(t, 1, m.sum(t, "pgbaton.held", "", ""))
	for _, p := range m.points(t, "pgbaton.acquire.attempts") {
		_, named := p.attrs.Value("pgbaton.name")
		assert.False(t, named, "lease names only with MetricNames")
		layer, _ := p.attrs.Value("pgbaton.layer")
		assert.Equal(t, "lease", layer.AsString())
	}

	require.NoError(t, l.Release(ctx))
	assert.EqualValues(t, 0, m.sum(t, "pgbaton.held", "", ""))
	assert.EqualValues(t, 1, m.sum(t, "pgbaton.hold.duration", "", ""))
	assert.EqualValues(t, 0, m.sum(t, "pgbaton.lost", "", ""), "a release is no loss")

	// Claim counts one acquired attempt per lease, held when none is free.
	_, err = a.Register(ctx, "g", "g1", "g2")
	require.NoError(t, err)
	got, err := a.Claim(ctx, "g", 5)
	require.NoError(t, err)
	require.Len(t, got, 2)
	none, err := b.Claim(ctx, "g", 1)
	require.NoError(t, err)
	require.Empty(t, none)
	assert.EqualValues(t, 3, m.sum(t, "pgbaton.acquire.attempts", "pgbaton.result", "acquired"))
	assert.EqualValues(t, 3, m.sum(t, "pgbaton.acquire.attempts", "pgbaton.result", "held"))
	assert.EqualValues(t, 2, m.sum(t, "pgbaton.held", "", ""))
	require.NoError(t, a.Complete(ctx, got...))
	assert.EqualValues(t, 0, m.sum(t, "pgbaton.held", "", ""))
	assert.EqualValues(t, 0, m.sum(t, "pgbaton.lost", "", ""))
}

func TestMetricsLossCauses(t *testing.T) {
	if env.Cluster() == nil {
		t.Skip("needs the throwaway cluster") // only with PGBATON_TEST_DSN
	}
	d := env.DB(t)
	pool := d.Pool(t)
	proxied, proxy := env.ProxiedPool(t, d)
	ctx := pgtest.Context(t, time.Minute)
	m := newMeter(t)

	// Superseded: taken over in the database; the holder learns at its
	// next renewal.
	a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: time.Minute, MeterProvider: m, MetricNames: true})
	l, err := a.TryAcquire(ctx, "stolen")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE pgbaton.lease SET owner = 'thief', token = nextval('pgbaton.lease_token_seq') WHERE name = 'stolen'")
	require.NoError(t, err)
	require.ErrorIs(t, l.Renew(ctx), leasetable.ErrNotHeld)
	assert.EqualValues(t, 1, m.sum(t, "pgbaton.lost", "pgbaton.cause", leasetable.CauseSuperseded))
	assert.EqualValues(t, 1, m.sum(t, "pgbaton.renew.failures", "pgbaton.name", "stolen"))

	// Renew: the network stalls, renewals hang until the local deadline.
	// A loss noticed later than the safety margin counts as a pause
	// (CauseExpired), so the margin is wide enough that a busy machine's
	// late timer cannot turn this into one: the default, TTL/10 (100ms),
	// was not wide enough once in CI.
	// Keep-alives every TTL/10 leave 1.2s for one to be on its way when
	// the deadline passes, or the loss is rightly no renewal failure.
	p := newClient(t, proxied, leasetable.Config{Owner: "p", TTL: 3 * shortTTL, SafetyMargin: 3 * shortTTL / 2,
		RenewInterval: 3 * shortTTL / 10, MeterProvider: m, MetricNames: true})
	lp, err := p.TryAcquire(ctx, "stalled")
	require.NoError(t, err)
	proxy.Stall()
	defer proxy.Resume()
	select {
	case <-lp.Done():
	case <-ctx.Done():
		t.Fatal("stalled lease not lost")
	}
	require.ErrorIs(t, lp.Err(), leasetable.ErrLeaseLost)
	// The session's keep-alive failed; it renews every lease of the client
	// at once, so it carries no lease name.
	pgtest.Eventually(t, 5*time.Second, func() (bool, error) {
		return m.sum(t, "pgbaton.renew.failures", "", "") >= 2, nil
	}, "the hung keep-alive was not counted")
	proxy.Resume()

	lost := map[string]int64{}
	for _, pt := range m.points(t, "pgbaton.lost") {
		name, _ := pt.attrs.Value("pgbaton.name")
		cause, _ := pt.attrs.Value("pgbaton.cause")
		lost[name.AsString()+"/"+cause.AsString()] += pt.value
	}
	assert.Equal(t, map[string]int64{"stolen/superseded": 1, "stalled/renew": 1}, lost)
	assert.EqualValues(t, 0, m.sum(t, "pgbaton.held", "", ""))
	assert.EqualValues(t, 2, m.sum(t, "pgbaton.hold.duration", "", ""))
	_ = lp.Release(ctx) // ErrNotHeld or nil: the background release of a lost lease may come first
	assert.EqualValues(t, 2, m.sum(t, "pgbaton.lost", "", ""), "releasing a lost lease counts no second loss")
}

// childMeterHold takes args[1] with TTL args[2] and a metrics reader,
// prints "token N", waits for the lease to end and prints "lost CAUSE N"
// for each cause pgbaton.lost counted.
func childMeterHold(ctx context.Context, args []string) error {
	ttl, err := time.ParseDuration(args[2])
	if err != nil {
		return err
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	pool, err := pgxpool.New(ctx, args[0])
	if err != nil {
		return err
	}
	defer pool.Close()
	c, err := leasetable.New(ctx, pool, leasetable.Config{TTL: ttl, Owner: "metered", MeterProvider: mp})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(ctx) }()
	l, err := c.TryAcquire(ctx, args[1])
	if err != nil {
		return err
	}
	pgtest.Printf("token %d", l.Token())
	<-l.Done()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return err
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "pgbaton.lost" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				cause, _ := dp.Attributes.Value("pgbaton.cause")
				pgtest.Printf("lost %s %d", cause.AsString(), dp.Value)
			}
		}
	}
	return nil
}

func TestMetricsPausedHolderExpired(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	k := env.StartChild(t, "meterhold", d.URL, "paused", shortTTL.String())
	k.Expect(t, "token", 30*time.Second)
	k.Signal(t, syscall.SIGSTOP)
	pgtestWaitExpired(t, pool, "paused")
	k.Signal(t, syscall.SIGCONT)
	assert.Equal(t, leasetable.CauseExpired+" 1", k.Expect(t, "lost", 10*time.Second))
	require.NoError(t, k.Wait(t, 10*time.Second), k.Stderr())
}
