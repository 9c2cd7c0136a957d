// Package metertest is an OpenTelemetry SDK meter provider whose metrics a
// test reads on demand.
package metertest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Provider is a meter provider (give it as Config.MeterProvider) and the
// reader of its metrics.
type Provider struct {
	*sdkmetric.MeterProvider
	Reader *sdkmetric.ManualReader
}

// New returns a Provider shut down with the test.
func New(t testing.TB) Provider {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return Provider{mp, r}
}

// Collect returns the metrics recorded so far, by name.
func (m Provider) Collect(t testing.TB) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, m.Reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, x := range sm.Metrics {
			out[x.Name] = x.Data
		}
	}
	return out
}
