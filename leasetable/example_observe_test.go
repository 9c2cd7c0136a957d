package leasetable_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgbaton/pgbaton/health"
	"github.com/pgbaton/pgbaton/leasetable"
)

// Operators see contention, hold times and losses through OpenTelemetry
// (any MeterProvider: Prometheus, OTLP; here the SDK's ManualReader), read
// losses and reconnects in the logs, and probe readiness with Check, for
// example through health.Handler.
func ExampleClient_Check() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()

	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(ctx)
	cfg := leasetable.Config{
		MeterProvider: provider,
		Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	node1, err := leasetable.New(ctx, pool, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer node1.Close(ctx)
	node2, err := leasetable.New(ctx, pool, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer node2.Close(ctx)

	lease, err := node1.TryAcquire(ctx, "report")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := node2.TryAcquire(ctx, "report"); err == nil {
		log.Fatal("two holders")
	}
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "pgbaton.acquire.attempts" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				result, _ := dp.Attributes.Value("pgbaton.result")
				fmt.Printf("%s %s: %d\n", m.Name, result.AsString(), dp.Value)
			}
		}
	}

	// Readiness: 200 while every check passes, 503 naming the failures.
	probe := health.Handler(health.Checks{"leases": node1})
	rec := httptest.NewRecorder()
	probe.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	fmt.Println("readyz:", rec.Code)
	// Unordered output:
	// pgbaton.acquire.attempts acquired: 1
	// pgbaton.acquire.attempts held: 1
	// readyz: 200
}
