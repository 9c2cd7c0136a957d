package advisory_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/health"
)

// A Locker is a health.Checker: a readiness probe fails while it cannot
// take locks (database down, a standby, a transaction pooler in between).
var _ health.Checker = (*advisory.Locker)(nil)

// Metrics go to any OpenTelemetry MeterProvider (in production usually
// one with a Prometheus or OTLP exporter; here a ManualReader so the
// example can print them), and the Locker serves as a readiness check.
func Example_metricsAndHealth() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)

	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	locker, err := advisory.New(pool, advisory.Config{MeterProvider: mp})
	if err != nil {
		panic(err)
	}
	defer locker.Close(ctx)

	// Readiness: mux.Handle("/readyz", ...) in a real server.
	srv := httptest.NewServer(health.Handler(health.Checks{"advisory": locker}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Print(resp.StatusCode, " ", string(body))

	err = locker.RunExclusive(ctx, advisory.Name("job:report"), func(ctx context.Context) error {
		return nil
	}, advisory.RunOptions{})
	if err != nil {
		panic(err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		panic(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "pgbaton.acquire.attempts" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				result, _ := dp.Attributes.Value("pgbaton.result")
				fmt.Printf("%s{result=%s} %d\n", m.Name, result.AsString(), dp.Value)
			}
		}
	}
	// Output:
	// 200 {"status":"ok","checks":{"advisory":"ok"}}
	// pgbaton.acquire.attempts{result=acquired} 1
}
