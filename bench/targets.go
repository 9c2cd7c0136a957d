package main

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// figures looks up medians by scenario title and implementation name
// prefixes.
type figures map[string][]*result

// median is NaN ("not measured") for an implementation that failed in any
// run: a median of the runs before the failure would judge a target on
// fewer runs than the report says, and its table tells the failure.
func (f figures) median(title, implPrefix, metric string) float64 {
	for _, r := range f[title] {
		if strings.HasPrefix(r.impl.name, implPrefix) {
			if r.err != nil {
				return math.NaN()
			}
			return r.median(metric)
		}
	}
	return math.NaN()
}

// writeTargets checks the targets against the medians: the report
// says which are met and which are missed.
func writeTargets(w io.Writer, e *env, f figures) {
	type row struct{ target, figure, verdict string }
	var rows []row
	verdict := func(ok bool, vals ...float64) string {
		for _, v := range vals {
			if math.IsNaN(v) {
				return "not measured"
			}
		}
		if ok {
			return "met"
		}
		return "**missed**"
	}
	for _, c := range []int{1, 8} {
		t := e.uncontendedScenario(c).title
		pg, rd := f.median(t, "pgbaton", "ops/s"), f.median(t, "redislock", "ops/s")
		rows = append(rows, row{fmt.Sprintf("advisory try + release ≥ Redis at %d client(s)", c),
			fmt.Sprintf("pgbaton ÷ redislock = %s", ratio(pg, rd)), verdict(pg >= rd, pg, rd)})
	}
	t := e.uncontendedScenario(8).title
	pg, pl := f.median(t, "pgbaton", "ops/s"), f.median(t, "go-pglock", "ops/s")
	pgc, plc := f.median(t, "pgbaton", "connections"), f.median(t, "go-pglock", "connections")
	rows = append(rows, row{"advisory try + release ≥ go-pglock at 8 clients with ≤ 1/4 of its connections",
		fmt.Sprintf("pgbaton ÷ go-pglock = %s ops/s, %.0f vs %.0f connections", ratio(pg, pl), pgc, plc),
		verdict(pg >= pl && pgc*4 <= plc, pg, pl, pgc, plc)})
	backlogs := []int{0}
	if e.backlog > 0 {
		backlogs = append(backlogs, e.backlog)
	}
	for _, bl := range backlogs {
		for _, b := range []int{1, 10, 100} {
			t := e.claimScenario(b, bl, nil).title
			pg, rv := f.median(t, "pgbaton", "items/s"), f.median(t, "River", "items/s")
			at := fmt.Sprintf("%d rows", e.rows)
			if bl > 0 {
				at = fmt.Sprintf("%d queued rows", e.rows+bl)
			}
			rows = append(rows, row{fmt.Sprintf("Claim ≥ River's throughput, batch %d, %s", b, at),
				fmt.Sprintf("pgbaton ÷ River = %s", ratio(pg, rv)), verdict(pg >= rv, pg, rv)})
		}
	}
	t = e.contendedScenario(8).title
	pg, raw := f.median(t, "pgbaton", "acquisitions/s"), f.median(t, "raw pgx", "acquisitions/s")
	rows = append(rows, row{"advisory contended, 8 clients on one key ≥ 1.0× raw pgx",
		fmt.Sprintf("pgbaton ÷ raw pgx = %s", ratio(pg, raw)), verdict(pg >= raw, pg, raw)})
	t = e.handoverScenario(true).title
	pg, raw = f.median(t, "pgbaton", "p50 ms"), f.median(t, "raw pgx", "p50 ms")
	rows = append(rows, row{"advisory handover after SIGKILL of the holder, p50 ≤ 1.2× raw pgx",
		fmt.Sprintf("%.3f ms vs %.3f ms = %s", pg, raw, ratio(pg, raw)), verdict(pg <= 1.2*raw, pg, raw)})
	p50 := f.median("Lease: handover latency on release", "pgbaton", "p50 ms")
	rows = append(rows, row{"lease handover on release p50 ≤ 2 ms", fmt.Sprintf("%.3f ms", p50), verdict(p50 <= 2, p50)})
	// Blocking advisory locks (the server's FIFO queue) are shown beside
	// the lease figures as what fair looks like.
	fair, advFair := f.median(contendTitle, "pgbaton", "fairness max/min"), f.median(contendTitle, "raw pgx", "fairness max/min")
	rows = append(rows, row{"contended lease, 8 processes on one name: fairness (most ÷ fewest grants) ≤ 1.2",
		fmt.Sprintf("%.2f (advisory FIFO %.2f)", fair, advFair), verdict(fair <= 1.2, fair)})
	lw, advLW := f.median(contendTitle, "pgbaton", "longest waiter granted %"), f.median(contendTitle, "raw pgx", "longest waiter granted %")
	rows = append(rows, row{"contended lease, 8 processes on one name: longest waiter granted ≥ 90 %",
		fmt.Sprintf("%.1f %% (advisory FIFO %.1f %%)", lw, advLW), verdict(lw >= 90, lw)})

	for _, n := range e.keepAlive {
		t := keepAliveTitle(n)
		lost, held := f.median(t, "pgbaton", "lost"), f.median(t, "pgbaton", "held at end")
		cps := f.median(t, "pgbaton", "commits/s")
		rows = append(rows, row{fmt.Sprintf("one client keeps %s leases alive (TTL %s): none lost", thousands(n), keepTTL),
			fmt.Sprintf("%.0f lost, %.0f held at the end, %.1f commits/s", lost, held, cps),
			verdict(lost == 0 && held == float64(n), lost, held, cps)})
	}

	fmt.Fprintf(w, "## Targets\n\n| target | figure (medians) | verdict |\n| --- | --- | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s |\n", r.target, r.figure, r.verdict)
	}
	fmt.Fprintln(w)
}
