package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgbaton/pgbaton/admin"
	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// dashboardPath is the Grafana dashboard shipped in the repository.
const dashboardPath = "../deploy/grafana/pgbaton.json"

// The dashboard cannot drift from the metrics: every metric name its
// queries use is exported (by /metrics, or by the library's OpenTelemetry
// instruments through the Prometheus exporter), every label it groups by
// exists on those metrics, and every exported metric has a panel.
func TestGrafanaDashboardMatchesTheMetrics(t *testing.T) {
	exported := map[string]*dto.MetricFamily{}

	// The database's side: a scrape of /metrics with every series present.
	f := newFixture(t)
	ts := serve(t, f.pool, admin.Config{AdminToken: testToken})
	code, body := post(t, ts, leaseForm(formToken(t, ts), "lease:a", "dashboard", testToken), nil)
	require.Equal(t, 200, code, body)
	for name, fam := range families(t, ts) {
		exported[name] = fam
	}

	// The clients' side: the library's instruments, each recorded once, as
	// the OpenTelemetry Prometheus exporter names them.
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	require.NoError(t, err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	ctx := context.Background()
	tel := telemetry.New("lease", telemetry.Config{MeterProvider: mp})
	tel.Attempt(ctx, "x", telemetry.Acquired, time.Millisecond)
	tel.AttemptFailed(ctx, "x", errors.New("boom"), time.Millisecond)
	tel.Ended(ctx, "x", time.Second, "expired")
	tel.RenewFailed(ctx, "x", errors.New("boom"))
	tel.SessionOpened(ctx)
	gathered, err := reg.Gather()
	require.NoError(t, err)
	for _, fam := range gathered {
		if strings.HasPrefix(fam.GetName(), "pgbaton_") {
			exported[fam.GetName()] = fam
		}
	}
	require.Contains(t, exported, "pgbaton_acquire_wait_duration_seconds", "the exporter's naming")

	raw, err := os.ReadFile(dashboardPath)
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))

	reName := regexp.MustCompile(`\bpgbaton_[a-z0-9_]+`)
	reBy := regexp.MustCompile(`\bby \(([^)]*)\)`)
	// Label names, in groupings and selectors, are not metric names.
	reLabels := regexp.MustCompile(`\b(by|on|without|ignoring) ?\([^)]*\)|\{[^}]*\}`)
	used := map[string]bool{}
	var exprs []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok {
			exprs = append(exprs, q)
		}
	}
	require.NotEmpty(t, exprs)
	for _, expr := range exprs {
		var fams []*dto.MetricFamily
		for _, name := range reName.FindAllString(reLabels.ReplaceAllString(expr, ""), -1) {
			fam := family(exported, name)
			require.NotNil(t, fam, "the dashboard queries %s, which no pgbaton metric exports: %s", name, expr)
			used[fam.GetName()] = true
			fams = append(fams, fam)
		}
		for _, m := range reBy.FindAllStringSubmatch(expr, -1) {
			for _, label := range strings.Split(m[1], ",") {
				label = strings.TrimSpace(label)
				if label == "le" || label == "" {
					continue
				}
				require.True(t, slices.ContainsFunc(fams, func(f *dto.MetricFamily) bool { return hasLabel(f, label) }),
					"the dashboard groups by %q, which its metrics do not carry: %s", label, expr)
			}
		}
	}
	for name := range exported {
		require.True(t, used[name], "metric %s has no panel in %s", name, dashboardPath)
	}
}

// family is the exported family a query's series name belongs to: the
// name itself, or a histogram's _bucket, _sum and _count series.
func family(exported map[string]*dto.MetricFamily, name string) *dto.MetricFamily {
	if fam, ok := exported[name]; ok {
		return fam
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if fam, ok := exported[strings.TrimSuffix(name, suffix)]; ok && strings.HasSuffix(name, suffix) && fam.GetType() == dto.MetricType_HISTOGRAM {
			return fam
		}
	}
	return nil
}

func hasLabel(fam *dto.MetricFamily, label string) bool {
	for _, m := range fam.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				return true
			}
		}
	}
	return false
}
