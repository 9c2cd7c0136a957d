package admin_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/admin"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// families scrapes /metrics and parses it.
func families(t *testing.T, ts *httptest.Server) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := ts.Client().Get(ts.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// scrape returns /metrics as series name{labels} → value.
func scrape(t *testing.T, ts *httptest.Server) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for name, fam := range families(t, ts) {
		for _, m := range fam.GetMetric() {
			v := m.GetGauge().GetValue()
			if fam.GetType() == dto.MetricType_COUNTER {
				v = m.GetCounter().GetValue()
			}
			out[name+labels(m)] = v
		}
	}
	return out
}

func labels(m *dto.Metric) string {
	if len(m.GetLabel()) == 0 {
		return ""
	}
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func TestMetricsFromTheDatabase(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	// An expired lease nobody has taken over yet.
	_, err := f.pool.Exec(ctx, `SELECT pgbaton.try_acquire('lease:expired', 'worker-3', 1)`)
	require.NoError(t, err)
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		var expired bool
		err := f.pool.QueryRow(ctx, `SELECT expires_at <= clock_timestamp() FROM pgbaton.lease WHERE name = 'lease:expired'`).Scan(&expired)
		return expired, err
	}, "lease:expired does not expire")
	tokens := map[string]float64{}
	rows, err := f.pool.Query(ctx, `SELECT name, token FROM pgbaton.lease WHERE token IS NOT NULL`)
	require.NoError(t, err)
	for rows.Next() {
		var name string
		var token int64
		require.NoError(t, rows.Scan(&name, &token))
		tokens[name] = float64(token)
	}
	require.NoError(t, rows.Err())
	require.Len(t, tokens, 3)

	ts := serve(t, f.pool, admin.Config{AdminToken: testToken, TopN: 2})
	m := scrape(t, ts)
	want := map[string]float64{
		"pgbaton_up":                                             1,
		"pgbaton_advisory_locks_held":                            2, // job:admin and (7,-8)
		"pgbaton_advisory_lock_waiters":                          1,
		"pgbaton_advisory_locks_contended":                       1,
		"pgbaton_advisory_sessions":                              1,
		"pgbaton_leases{state=held}":                             2, // lease:a, shard-0
		"pgbaton_leases{state=expired}":                          1,
		"pgbaton_leases{state=free}":                             1, // shard-1
		"pgbaton_lease_token_max":                                max(tokens["lease:a"], tokens["shard-0"], tokens["lease:expired"]),
		"pgbaton_lease_group_leases{group=,state=held}":          1,
		"pgbaton_lease_group_leases{group=,state=expired}":       1,
		"pgbaton_lease_group_leases{group=shards,state=held}":    1,
		"pgbaton_lease_group_leases{group=shards,state=expired}": 0,
		"pgbaton_lease_group_token_max{group=shards}":            tokens["shard-0"],
		"pgbaton_lease_group_token_max{group=}":                  max(tokens["lease:a"], tokens["lease:expired"]),
		"pgbaton_lease_token{group=,lease=lease:expired}":        tokens["lease:expired"],
		"pgbaton_lease_token{group=shards,lease=shard-0}":        tokens["shard-0"],
	}
	for k, v := range want {
		require.Contains(t, m, k)
		require.Equal(t, v, m[k], k)
	}
	// TopN bounds the per-lease series: lease:a has the lowest token of three.
	require.NotContains(t, m, "pgbaton_lease_token{group=,lease=lease:a}")
	require.Positive(t, m["pgbaton_lock_table_capacity_entries"])
	require.GreaterOrEqual(t, m["pgbaton_lock_table_advisory_entries"], 3.0, "two held and one waiting, at least")
	require.GreaterOrEqual(t, m["pgbaton_lock_table_used_entries"], m["pgbaton_lock_table_advisory_entries"])
	require.NotContains(t, m, "pgbaton_audit_events_total{action=force_release_lease}")

	// A release shows up at the next scrape: one lease fewer, one audit event.
	code, body := post(t, ts, leaseForm(formToken(t, ts), "lease:a", "metrics test", testToken), nil)
	require.Equal(t, http.StatusOK, code, body)
	m = scrape(t, ts)
	require.Equal(t, 1.0, m["pgbaton_leases{state=held}"])
	require.Equal(t, 2.0, m["pgbaton_leases{state=free}"])
	require.Equal(t, 1.0, m["pgbaton_audit_events_total{action=force_release_lease}"])
	require.Greater(t, m["pgbaton_lease_token_max"], want["pgbaton_lease_token_max"], "the release drew a new token")
}

// The exposition follows Prometheus' naming and typing conventions, as
// promlint checks them (counters end in _total, units in base units and in
// the name, no reserved suffixes on gauges), and carries pgbaton_build_info.
func TestMetricsPassPromlint(t *testing.T) {
	f := newFixture(t)
	ts := serve(t, f.pool, admin.Config{AdminToken: testToken, Version: "v1.2.3", Revision: "abc123"})
	// An audit event, so that the counter has a series to lint.
	code, body := post(t, ts, leaseForm(formToken(t, ts), "lease:a", "lint", testToken), nil)
	require.Equal(t, http.StatusOK, code, body)

	fams := families(t, ts)
	var list []*dto.MetricFamily
	for _, fam := range fams {
		list = append(list, fam)
	}
	problems, err := promlint.NewWithMetricFamilies(list).Lint()
	require.NoError(t, err)
	require.Empty(t, problems, "promlint")

	require.Equal(t, dto.MetricType_COUNTER, fams["pgbaton_audit_events_total"].GetType())
	info := fams["pgbaton_build_info"]
	require.NotNil(t, info)
	require.Equal(t, dto.MetricType_GAUGE, info.GetType())
	got := map[string]string{}
	for _, l := range info.GetMetric()[0].GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	require.Equal(t, map[string]string{"version": "v1.2.3", "revision": "abc123", "goversion": runtime.Version()}, got)
	require.Equal(t, 1.0, info.GetMetric()[0].GetGauge().GetValue())

	// A server with its own registry gets the same series from Collector.
	srv, err := admin.New(f.pool, admin.Config{})
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(srv.Collector())
	gathered, err := reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, fam := range gathered {
		names = append(names, fam.GetName())
	}
	require.Contains(t, names, "pgbaton_up")
	require.Contains(t, names, "pgbaton_leases")
}

// A timeline change (here the stored one is cleared, as a restore into
// another cluster would look) imposes the failover grace: /metrics gives
// the seconds left and the page says why no lease is granted; turned off,
// both say so.
func TestFailoverGraceShows(t *testing.T) {
	ctx := context.Background()
	d := env.DB(t)
	pool := d.Pool(t)
	for _, sql := range []string{
		`SELECT pgbaton.try_acquire('lease:a', 'worker-1', 60000)`, // a 60 s TTL in use
		`UPDATE pgbaton.token_epoch SET timeline = NULL`,
		`SELECT pgbaton.sync_epoch()`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	ts := serve(t, pool, admin.Config{})
	m := scrape(t, ts)
	require.Equal(t, 1.0, m["pgbaton_failover_grace_enabled"])
	require.Greater(t, m["pgbaton_failover_grace_remaining_seconds"], 50.0)
	code, body := get(t, ts, "/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `id="grace"`)
	require.Contains(t, body, "no lease is granted until")

	_, err := pool.Exec(ctx, `SELECT pgbaton.set_failover_grace(false, 'synchronous replication')`)
	require.NoError(t, err)
	m = scrape(t, ts)
	require.Equal(t, 0.0, m["pgbaton_failover_grace_enabled"])
	require.Equal(t, 0.0, m["pgbaton_failover_grace_remaining_seconds"])
	_, body = get(t, ts, "/")
	require.Contains(t, body, "The failover grace is off")
}
