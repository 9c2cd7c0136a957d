package telemetry_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgbaton/pgbaton/internal/telemetry"
)

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
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	i := telemetry.New("lease", telemetry.Config{MeterProvider: mp})
	i.Attempt(ctx, "job:a", telemetry.Acquired, 3*time.Millisecond)
	i.Attempt(ctx, "job:a", telemetry.Held, time.Millisecond)
	i.RenewFailed(ctx, "job:a")
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
	require.Contains(t, got, "pgbaton.renew.failures")
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
