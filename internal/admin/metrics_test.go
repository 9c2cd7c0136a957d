package admin_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/admin"
	"github.com/pgbaton/pgbaton/internal/pgtest"
)

// scrape returns /metrics as series name{labels} → value.
func scrape(t *testing.T, ts *httptest.Server) map[string]float64 {
	t.Helper()
	resp, err := ts.Client().Get(ts.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	out := map[string]float64{}
	for name, fam := range families {
		for _, m := range fam.GetMetric() {
			out[name+labels(m)] = m.GetGauge().GetValue()
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
	require.Positive(t, m["pgbaton_lock_table_capacity"])
	require.GreaterOrEqual(t, m["pgbaton_lock_table_advisory"], 3.0, "two held and one waiting, at least")
	require.GreaterOrEqual(t, m["pgbaton_lock_table_used"], m["pgbaton_lock_table_advisory"])
	require.NotContains(t, m, "pgbaton_audit_events{action=force_release_lease}")

	// A release shows up at the next scrape: one lease fewer, one audit event.
	code, body := post(t, ts, leaseForm(formToken(t, ts), "lease:a", "metrics test", testToken), nil)
	require.Equal(t, http.StatusOK, code, body)
	m = scrape(t, ts)
	require.Equal(t, 1.0, m["pgbaton_leases{state=held}"])
	require.Equal(t, 2.0, m["pgbaton_leases{state=free}"])
	require.Equal(t, 1.0, m["pgbaton_audit_events{action=force_release_lease}"])
	require.Greater(t, m["pgbaton_lease_token_max"], want["pgbaton_lease_token_max"], "the release drew a new token")
}
