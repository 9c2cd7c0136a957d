package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// metric is one number a scenario measures. The first metric of a scenario
// is its primary one: the ratios are computed on it.
type metric struct {
	name         string // column header, with its unit
	higherBetter bool
	format       string // fmt verb for the value, default "%.0f"
}

// sample is one measurement of one implementation: metric name -> value.
type sample map[string]float64

// impl is one implementation of a scenario's operation.
type impl struct {
	name string
	// skip, when not empty, says why this implementation is not measured.
	skip string
	// setup runs once before the runs, teardown once after.
	setup    func(ctx context.Context) error
	teardown func(ctx context.Context) error
	// run measures once.
	run func(ctx context.Context) (sample, error)
}

// scenario is one operation measured for every implementation, in
// interleaved runs: run 1 measures every implementation once (in the
// order of runOrder), then run 2 does, and so on, so that drift of the
// machine (other load, caches, autovacuum) hits all of them alike.
type scenario struct {
	title   string
	note    string
	metrics []metric
	impls   []*impl
	// runs lowers the global number of runs (e.g. slow fault runs).
	runs int
	// noWarmup skips the warm-up run (runs that set up their own data).
	noWarmup bool
	// noRatios leaves out the ratio columns (no raw pgx row to compare).
	noRatios bool
}

// effectiveRuns is how many recorded runs sc gets when runs are asked for.
func (sc *scenario) effectiveRuns(runs int) int {
	if sc.runs > 0 {
		return min(runs, sc.runs)
	}
	return runs
}

type result struct {
	impl   *impl
	values map[string][]float64
	err    error
}

func (r *result) median(m string) float64 {
	v := slices.Clone(r.values[m])
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func (r *result) minmax(m string) (float64, float64) {
	v := r.values[m]
	if len(v) == 0 {
		return math.NaN(), math.NaN()
	}
	return slices.Min(v), slices.Max(v)
}

// runOrder is the order in which run r measures n implementations: the
// rows of a balanced Latin square (Williams), so that over n runs (2n
// when n is odd) each implementation runs right after each other one
// equally often, and first and last equally often. A run inherits what
// the one before it left on the server (WAL to flush, dirty buffers,
// dead rows for autovacuum); in a plain rotation each implementation
// always followed the same one (pgbaton's claim always came right after
// gue's 10,000 one-row transactions).
func runOrder(r, n int) []int {
	order := make([]int, n)
	for j := range order {
		// The first row is 0, 1, n-1, 2, n-2, …; row r adds r to it.
		first := (j + 1) / 2
		if j%2 == 0 && j > 0 {
			first = n - j/2
		}
		order[j] = (first + r) % n
	}
	if n%2 == 1 && (r/n)%2 == 1 {
		slices.Reverse(order)
	}
	return order
}

// runScenario measures every implementation runs times, interleaved (in
// runOrder), after one unrecorded warm-up run each.
func runScenario(ctx context.Context, sc *scenario, runs int, logf func(string, ...any)) []*result {
	runs = sc.effectiveRuns(runs)
	results := make([]*result, len(sc.impls))
	var live []int
	for i, im := range sc.impls {
		results[i] = &result{impl: im, values: map[string][]float64{}}
		if im.skip != "" {
			continue
		}
		if im.setup != nil {
			if err := im.setup(ctx); err != nil {
				results[i].err = fmt.Errorf("setup: %w", err)
				logf("  %s: setup failed: %v", im.name, err)
				continue
			}
		}
		live = append(live, i)
	}
	first := -1 // r = -1 is the warm-up
	if sc.noWarmup {
		first = 0
	}
	for r := first; r < runs; r++ {
		for _, k := range runOrder(max(r, 0), len(live)) {
			i := live[k]
			res := results[i]
			if res.err != nil || ctx.Err() != nil {
				continue
			}
			s, err := res.impl.run(ctx)
			if err != nil {
				res.err = err
				logf("  %s: %v", res.impl.name, err)
				continue
			}
			if r < 0 {
				continue
			}
			for k, v := range s {
				res.values[k] = append(res.values[k], v)
			}
		}
		if r >= 0 {
			logf("  run %d/%d done", r+1, runs)
		}
	}
	for _, i := range live {
		if td := sc.impls[i].teardown; td != nil {
			if err := td(context.WithoutCancel(ctx)); err != nil && results[i].err == nil {
				results[i].err = fmt.Errorf("teardown: %w", err)
			}
		}
	}
	return results
}

func fmtv(m metric, v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	f := m.format
	if f == "" {
		f = "%.0f"
	}
	return fmt.Sprintf(f, v)
}

func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "–"
	}
	if r := a / b; r > 0 && r < 0.095 {
		// Two significant digits: 0.0031×, not 0.00×.
		return fmt.Sprintf("%.*f×", 1-int(math.Floor(math.Log10(r))), r)
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// writeTable prints a scenario's results as markdown: per metric the
// median and min–max over the runs, then for the primary metric this
// implementation ÷ raw pgx and pgbaton ÷ this implementation.
func writeTable(w io.Writer, sc *scenario, results []*result, runs int) {
	runs = sc.effectiveRuns(runs)
	p := sc.metrics[0]
	better := "higher is better"
	if !p.higherBetter {
		better = "lower is better"
	}
	fmt.Fprintf(w, "### %s\n\n", sc.title)
	if sc.note != "" {
		fmt.Fprintf(w, "%s\n\n", sc.note)
	}
	if runs == 1 {
		fmt.Fprintf(w, "One run; ratios on %s (%s).\n\n", p.name, better)
	} else {
		fmt.Fprintf(w, "Median of %d interleaved runs, min–max in brackets; ratios on %s (%s).\n\n", runs, p.name, better)
	}
	hdr := []string{"implementation"}
	for _, m := range sc.metrics {
		hdr = append(hdr, m.name)
	}
	if !sc.noRatios {
		hdr = append(hdr, "÷ raw pgx", "pgbaton ÷ this")
	}
	pad := len(hdr) - 2 // empty cells after a skipped or failed row's reason
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(hdr, " | "), strings.Repeat(" --- |", len(hdr)))
	var raw, ours float64 = math.NaN(), math.NaN()
	for _, r := range results {
		switch {
		case strings.HasPrefix(r.impl.name, "raw pgx"):
			raw = r.median(p.name)
		case strings.HasPrefix(r.impl.name, "pgbaton") && math.IsNaN(ours):
			ours = r.median(p.name)
		}
	}
	var failed []string // implementations that failed after some runs
	for _, r := range results {
		row := []string{r.impl.name}
		switch {
		case r.impl.skip != "":
			row = append(row, "skipped: "+r.impl.skip)
			for range pad {
				row = append(row, "")
			}
		case r.err != nil && len(r.values[p.name]) == 0:
			row = append(row, "failed: "+strings.ReplaceAll(r.err.Error(), "|", "/"))
			for range pad {
				row = append(row, "")
			}
		default:
			if r.err != nil {
				failed = append(failed, fmt.Sprintf("%s: %d of %d runs, then failed: %s",
					r.impl.name, len(r.values[p.name]), runs, r.err))
			}
			for _, m := range sc.metrics {
				lo, hi := r.minmax(m.name)
				cell := fmtv(m, r.median(m.name))
				if len(r.values[m.name]) > 1 {
					cell += fmt.Sprintf(" (%s–%s)", fmtv(m, lo), fmtv(m, hi))
				}
				row = append(row, cell)
			}
			if !sc.noRatios {
				med := r.median(p.name)
				row = append(row, ratio(med, raw), ratio(ours, med))
			}
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Fprintln(w)
	for _, f := range failed {
		fmt.Fprintf(w, "**%s** (its row is the median of those runs; no target is judged on it)\n\n", f)
	}
}

// durationsMs converts latencies to milliseconds and returns p50 and p99.
func percentiles(d []time.Duration) (p50, p99 float64) {
	if len(d) == 0 {
		return math.NaN(), math.NaN()
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return float64(s[max(i, 0)]) / float64(time.Millisecond)
	}
	return at(0.50), at(0.99)
}
