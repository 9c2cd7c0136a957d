package main

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// synthetic builds a result of impl name with the given values per metric.
func synthetic(name string, values map[string][]float64) *result {
	return &result{impl: &impl{name: name}, values: values}
}

// syntheticFigures has every scenario the charts draw, under the titles
// the scenarios really have, plus the keep-alive ones under the titles
// they are to have ("Keep-alive: 100,000 leases held by one client").
func syntheticFigures() figures {
	e := &env{window: time.Millisecond, samples: 1, killRuns: 1, rows: 10000, backlog: 990000, holds: []int{1}}
	all := figures{}
	for _, deep := range []bool{false, true} {
		for i, batch := range []int{1, 10, 100} {
			bl, slow := 0, 1.0
			if deep {
				bl, slow = e.backlog, 0.9
			}
			f := float64(batch)
			gue := []float64{509, 549 + float64(i), 597}
			if deep {
				gue = []float64{2, 3, 3}
			}
			all[e.claimScenario(batch, bl, nil).title] = []*result{
				synthetic("pgbaton leasetable Claim", map[string][]float64{"items/s": {2000 * f * slow, 2300 * f * slow, 2100 * f * slow}}),
				synthetic("raw pgx (same SQL functions)", map[string][]float64{"items/s": {1900 * f * slow, 2200 * f * slow, 2000 * f * slow}}),
				synthetic("River (riverpgxv5)", map[string][]float64{"items/s": {1800 * math.Sqrt(f), 1900 * math.Sqrt(f), 2000 * math.Sqrt(f)}}),
				synthetic("gue v5 (pgxv5)", map[string][]float64{"items/s": gue}),
			}
		}
	}
	lat := func(p50, p99 float64) map[string][]float64 {
		return map[string][]float64{"p50 ms": {p50 * 0.9, p50, p50 * 1.2}, "p99 ms": {p99, p99 * 1.1, p99 * 0.95}}
	}
	all[e.handoverScenario(false).title] = []*result{
		synthetic("pgbaton advisory.Locker", lat(0.22, 0.33)),
		synthetic("raw pgx (conn per client)", lat(0.18, 0.28)),
		synthetic("go-pglock (conn per lock)", lat(0.19, 0.29)),
		{impl: &impl{name: "redislock (Redis SET NX PX)", skip: "no redis-server"}, values: map[string][]float64{}},
	}
	all[e.handoverScenario(true).title] = []*result{
		synthetic("pgbaton advisory.Locker", lat(3.0, 5.5)),
		synthetic("raw pgx (conn per client)", lat(1.1, 3.7)),
		{impl: &impl{name: "go-pglock (conn per lock)"}, values: map[string][]float64{}, err: errors.New("failed")},
	}
	for _, sc := range e.leaseScenarios() {
		switch {
		case strings.Contains(sc.title, "handover latency on release"):
			all[sc.title] = []*result{
				synthetic("pgbaton leasetable.Client", lat(1.2, 1.65)),
				synthetic("raw pgx (same SQL functions)", lat(1.42, 1.96)),
				synthetic("redislock (Redis SET NX PX)", lat(1.38, 1.64)),
			}
		case strings.Contains(sc.title, "SIGKILL"):
			all[sc.title] = []*result{
				synthetic("pgbaton leasetable.Client", lat(1006.7, 1008.1)),
				synthetic("redislock (Redis SET NX PX)", lat(995.8, 996.4)),
			}
		}
	}
	for _, n := range []int{100, 1000, 10000, 100000} {
		f := float64(n)
		all[fmt.Sprintf("Keep-alive: %s leases held by one client", commas(f))] = []*result{
			synthetic("pgbaton leasetable.Client", map[string][]float64{
				"server commits/s": {2 + f/20000, 2.2 + f/20000, 1.9 + f/20000}, "leases lost": {0, 0, 0}}),
			synthetic("raw pgx (one keep-alive per lease)", map[string][]float64{
				"server commits/s": {f / 10, f / 9, f / 11}, "leases lost": {0, math.Floor(f / 20000), 0}}),
		}
	}
	return all
}

// checkSVG fails t unless path is well-formed XML with an <svg> root.
func checkSVG(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(strings.NewReader(string(b)))
	root := ""
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: not well-formed XML: %v", path, err)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	if root != "svg" {
		t.Fatalf("%s: root element %q, want svg", path, root)
	}
	return string(b)
}

func TestChartsWritten(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "charts")
	paths, err := writeCharts(dir, syntheticFigures())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range paths {
		names = append(names, filepath.Base(p))
	}
	want := []string{"claim-throughput.svg", "keepalive-cost.svg", "handover-latency.svg"}
	if !slices.Equal(names, want) {
		t.Fatalf("wrote %v, want %v", names, want)
	}
	// Text the charts must show (SVG escapes nothing in these).
	mustShow := map[string][]string{
		"claim-throughput.svg": {"10,000 rows queued", "10,000 of 1,000,000 queued rows", "pgbaton leasetable Claim", "gue v5 (pgxv5)", "batch size"},
		"keepalive-cost.svg":   {"100,000", "Server commits per second", "Leases lost", "server commits/s", "raw pgx (one keep-alive per lease)"},
		"handover-latency.svg": {"Advisory lock: on release", "Lease: after SIGKILL of the holder (TTL 1s)", "p50 and p99", "go-pglock", "redislock"},
	}
	for _, p := range paths {
		svg := checkSVG(t, p)
		for _, s := range mustShow[filepath.Base(p)] {
			if !strings.Contains(svg, s) {
				t.Errorf("%s does not show %q", filepath.Base(p), s)
			}
		}
		if !strings.Contains(svg, "sans-serif") {
			t.Errorf("%s: no generic font fallback", filepath.Base(p))
		}
	}
}

func TestChartsSkipMissing(t *testing.T) {
	full := syntheticFigures()
	only := func(keep func(title string) bool) figures {
		f := figures{}
		for t, rs := range full {
			if keep(t) {
				f[t] = rs
			}
		}
		return f
	}
	for _, tc := range []struct {
		name string
		all  figures
		want []string
	}{
		{"nothing", figures{}, nil},
		{"handover only", only(func(t string) bool { return strings.Contains(t, "handover") }), []string{"handover-latency.svg"}},
		{"no keep-alive", only(func(t string) bool { return !strings.HasPrefix(t, "Keep-alive") }), []string{"claim-throughput.svg", "handover-latency.svg"}},
		{"shallow claims only", only(func(t string) bool { return strings.HasSuffix(t, ", 10000 rows") }), []string{"claim-throughput.svg"}},
		{"one batch size", only(func(t string) bool { return strings.HasPrefix(t, "Work items: claim + complete, batch 10,") }), []string{"claim-throughput.svg"}},
		{"every implementation skipped or failed", figures{
			"Advisory lock: handover latency on release":  {{impl: &impl{name: "redislock", skip: "no redis-server"}, values: map[string][]float64{}}},
			"Keep-alive: 1,000 leases held by one client": {{impl: &impl{name: "pgbaton"}, values: map[string][]float64{}, err: errors.New("x")}},
		}, nil},
		{"keep-alive without a lost metric, one run", figures{
			"Keep-alive: 10 leases held by one client":    {synthetic("pgbaton", map[string][]float64{"commits/s (server)": {3}})},
			"Keep-alive: 1,000 leases held by one client": {synthetic("pgbaton", map[string][]float64{"commits/s (server)": {4}})},
		}, []string{"keepalive-cost.svg"}},
		{"keep-alive with no number", figures{
			"Keep-alive: many leases": {synthetic("pgbaton", map[string][]float64{"commits/s": {3}})},
		}, nil},
		{"all zero", figures{
			"Keep-alive: 10 leases":                          {synthetic("pgbaton", map[string][]float64{"commits/s": {0}, "lost": {0}})},
			"Lease: handover latency on release":             {synthetic("pgbaton", map[string][]float64{"p50 ms": {0}, "p99 ms": {0}})},
			"Work items: claim + complete, batch 1, 10 rows": {synthetic("gue", map[string][]float64{"items/s": {0}})},
		}, []string{"claim-throughput.svg", "keepalive-cost.svg", "handover-latency.svg"}},
		{"NaN", figures{
			"Lease: handover latency on release": {synthetic("pgbaton", map[string][]float64{"p50 ms": {math.NaN()}})},
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "charts")
			paths, err := writeCharts(dir, tc.all)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, p := range paths {
				names = append(names, filepath.Base(p))
				checkSVG(t, p)
			}
			if !slices.Equal(names, tc.want) {
				t.Errorf("wrote %v, want %v", names, tc.want)
			}
			if len(tc.want) == 0 {
				if _, err := os.Stat(dir); !os.IsNotExist(err) {
					t.Errorf("%s exists with no chart to write (err %v)", dir, err)
				}
			}
		})
	}
}

func TestChartsSection(t *testing.T) {
	tmp := t.TempDir()
	var logged []string
	logf := func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) }
	md := chartsSection(filepath.Join(tmp, "charts"), filepath.Join(tmp, "RESULTS.md"), syntheticFigures(), logf)
	for _, want := range []string{
		"## Charts\n",
		"![Claim throughput against backlog](charts/claim-throughput.svg)\n",
		"![Keep-alive cost against leases held](charts/keepalive-cost.svg)\n",
		"![Handover latency](charts/handover-latency.svg)\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("section lacks %q:\n%s", want, md)
		}
	}
	if len(logged) > 0 {
		t.Errorf("logged %v", logged)
	}
	if md := chartsSection(filepath.Join(tmp, "none"), "", figures{}, logf); md != "" {
		t.Errorf("section without charts: %q", md)
	}
	// A directory that cannot be made is logged, not fatal.
	blocker := filepath.Join(tmp, "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if md := chartsSection(filepath.Join(blocker, "charts"), "", syntheticFigures(), logf); md != "" || len(logged) != 1 {
		t.Errorf("unwritable dir: section %q, logged %v", md, logged)
	}
}

func TestCommas(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 1: "1", 999: "999", 1000: "1,000", 1000000: "1,000,000", -12345: "-12,345", 0.5: "0.5", 2.25: "2.25"} {
		if got := commas(v); got != want {
			t.Errorf("commas(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestChartsSample writes the charts of the synthetic figures into
// $BENCH_CHART_SAMPLES, to look at them.
func TestChartsSample(t *testing.T) {
	dir := os.Getenv("BENCH_CHART_SAMPLES")
	if dir == "" {
		t.Skip("BENCH_CHART_SAMPLES not set")
	}
	if _, err := writeCharts(dir, syntheticFigures()); err != nil {
		t.Fatal(err)
	}
}
