package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// provider is an SDK MeterProvider whose metrics the test collects.
func provider() (*sdkmetric.ManualReader, *sdkmetric.MeterProvider) {
	reader := sdkmetric.NewManualReader()
	return reader, sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
}

func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

func TestInstrumentsRecordWithBoundedAttributes(t *testing.T) {
	ctx := context.Background()
	reader, mp := provider()
	i := telemetry.New("lease", telemetry.Config{MeterProvider: mp})
	i.Attempt(ctx, "job:a", telemetry.Acquired, 3*time.Millisecond)
	i.Attempt(ctx, "job:a", telemetry.Held, time.Millisecond)
	i.RenewFailed(ctx, "job:a", context.DeadlineExceeded)
	i.Ended(ctx, "job:a", time.Second, "expired")

	got := collect(t, reader)
	attempts := got["pgbaton.acquire.attempts"].(metricdata.Sum[int64])
	require.Len(t, attempts.DataPoints, 2, "one series per result")
	for _, dp := range attempts.DataPoints {
		_, hasName := dp.Attributes.Value("pgbaton.name")
		require.False(t, hasName, "names only when asked for")
		require.EqualValues(t, 1, dp.Value)
	}
	held := got["pgbaton.held"].(metricdata.Sum[int64])
	require.EqualValues(t, 0, held.DataPoints[0].Value, "acquired then ended")
	lost := got["pgbaton.lost"].(metricdata.Sum[int64])
	cause, _ := lost.DataPoints[0].Attributes.Value("pgbaton.cause")
	require.Equal(t, "expired", cause.AsString())
	renew := got["pgbaton.renew.failures"].(metricdata.Sum[int64])
	et, _ := renew.DataPoints[0].Attributes.Value(telemetry.ErrorTypeKey)
	require.Equal(t, "timeout", et.AsString(), "renew failures carry error.type")
	require.Contains(t, got, "pgbaton.hold.duration")

	named := telemetry.New("advisory", telemetry.Config{MeterProvider: mp, WithNames: true})
	named.Attempt(ctx, "job:b", telemetry.Error, 0)
	for _, dp := range collect(t, reader)["pgbaton.acquire.attempts"].(metricdata.Sum[int64]).DataPoints {
		if layer, _ := dp.Attributes.Value("pgbaton.layer"); layer.AsString() == "advisory" {
			name, ok := dp.Attributes.Value("pgbaton.name")
			require.True(t, ok)
			require.Equal(t, "job:b", name.AsString())
		}
	}
}

func TestNoProviderIsNoop(t *testing.T) {
	i := telemetry.New("advisory", telemetry.Config{})
	i.Attempt(context.Background(), "x", telemetry.Acquired, 0)
	i.SessionOpened(context.Background())
	i.SessionClosed(context.Background())
}

// A nil *Instruments (no MeterProvider) records nothing and returns
// before building an attribute or a context: no allocation, where no-op
// instruments would allocate their attribute sets.
func TestNilInstrumentsAllocateNothing(t *testing.T) {
	var i *telemetry.Instruments
	ctx, err, start := context.Background(), errors.New("x"), time.Now()
	allocs := testing.AllocsPerRun(1000, func() {
		i.Attempt(ctx, "x", telemetry.Acquired, time.Millisecond)
		i.AttemptSince(ctx, "x", telemetry.Held, start)
		i.AttemptFailed(ctx, "x", err, time.Millisecond)
		i.AttemptFailedSince(ctx, "x", err, start)
		i.Ended(ctx, "x", time.Second, "expired")
		i.RenewFailed(ctx, "x", err)
		i.SessionOpened(ctx)
		i.SessionClosed(ctx)
		i.ClockStepped(ctx)
	})
	require.Zero(t, allocs)
}

// The duration histograms advise explicit boundaries from 100 µs to
// minutes (waits) and to an hour (holds), which the SDK applies unless a
// View says otherwise: a 300 µs wait and a 2-minute one land in buckets of
// their own, not in the SDK default's first and last.
func TestHistogramsAdviseBuckets(t *testing.T) {
	ctx := context.Background()
	reader, mp := provider()
	i := telemetry.New("advisory", telemetry.Config{MeterProvider: mp})
	i.Attempt(ctx, "x", telemetry.Acquired, 300*time.Microsecond)
	i.Attempt(ctx, "x", telemetry.Acquired, 2*time.Minute)
	i.Ended(ctx, "x", 45*time.Minute, "")

	got := collect(t, reader)
	wait := got["pgbaton.acquire.wait.duration"].(metricdata.Histogram[float64]).DataPoints[0]
	require.Equal(t, telemetry.WaitBuckets, wait.Bounds)
	require.Equal(t, 0.0001, wait.Bounds[0], "100 µs")
	require.Equal(t, 600.0, wait.Bounds[len(wait.Bounds)-1], "10 minutes")
	var filled []float64
	for b, n := range wait.BucketCounts {
		if n > 0 {
			filled = append(filled, wait.Bounds[b])
		}
	}
	require.Equal(t, []float64{0.0005, 120}, filled, "upper bounds of the two waits' buckets")
	hold := got["pgbaton.hold.duration"].(metricdata.Histogram[float64]).DataPoints[0]
	require.Equal(t, telemetry.HoldBuckets, hold.Bounds)
	require.Equal(t, 3600.0, hold.Bounds[len(hold.Bounds)-1])
}

func TestAttemptFailedCarriesErrorType(t *testing.T) {
	ctx := context.Background()
	reader, mp := provider()
	i := telemetry.New("lease", telemetry.Config{MeterProvider: mp})
	i.AttemptFailed(ctx, "x", fmt.Errorf("acquire x: %w", &pgconn.PgError{Code: "53200"}), time.Millisecond)
	i.AttemptFailed(ctx, "x", fmt.Errorf("acquire x: %w", context.DeadlineExceeded), time.Second)
	types := map[string]int64{}
	for _, dp := range collect(t, reader)["pgbaton.acquire.attempts"].(metricdata.Sum[int64]).DataPoints {
		et, ok := dp.Attributes.Value(telemetry.ErrorTypeKey)
		require.True(t, ok)
		result, _ := dp.Attributes.Value("pgbaton.result")
		require.Equal(t, telemetry.Error, result.AsString())
		types[et.AsString()] += dp.Value
	}
	require.Equal(t, map[string]int64{"53200": 1, "timeout": 1}, types)
}

func TestErrorType(t *testing.T) {
	for want, err := range map[string]error{
		"":                              nil,
		"57P01":                         fmt.Errorf("session: %w", &pgconn.PgError{Code: "57P01"}),
		telemetry.ErrorTimeout:          fmt.Errorf("wait: %w", context.DeadlineExceeded),
		telemetry.ErrorCanceled:         context.Canceled,
		telemetry.ErrorStandby:          fmt.Errorf("x: %w", pgbaton.ErrStandby),
		telemetry.ErrorNotMigrated:      pgbaton.ErrNotMigrated,
		telemetry.ErrorSchemaTooNew:     pgbaton.ErrSchemaTooNew,
		telemetry.ErrorConnection:       &net.OpError{Op: "read", Err: errors.New("connection reset by peer")},
		telemetry.ErrorConnection + " ": io.ErrUnexpectedEOF,
		telemetry.ErrorOther:            errors.New("something else"),
	} {
		require.Equal(t, strings.TrimSpace(want), telemetry.ErrorType(err), "%v", err)
	}
}

// Tracing off costs the hot path nothing: no span, no allocation.
func TestTracerOffAllocatesNothing(t *testing.T) {
	for name, tr := range map[string]telemetry.Tracer{"nil": telemetry.NewTracer(nil), "noop": telemetry.NewTracer(tracenoop.NewTracerProvider())} {
		ctx := context.Background()
		allocs := testing.AllocsPerRun(1000, func() {
			c, span := tr.Start(ctx, "pgbaton.test", "lease")
			if span.IsRecording() {
				t.Fatal("a span records with tracing off")
			}
			telemetry.End(span, telemetry.Acquired, nil)
			telemetry.EndGrant(span, telemetry.NameKey, "x", "owner", time.Time{}, 1, 7, telemetry.Acquired, nil)
			telemetry.EndComplete(span, "owner", 1, nil)
			telemetry.EndKeepalive(span, "owner", 1, 1, true, nil)
			_ = c
		})
		if allocs != 0 {
			t.Errorf("%s: tracing off allocates %.1f times per call", name, allocs)
		}
	}
}
