package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/pgbaton/pgbaton/examples/demo/internal/demodb"
)

// summary checks the invariants in the database and prints the table.
func (r *demoRun) summary(ctx context.Context, sc *scenarioResult, items int) error {
	slots, err := r.q.DemoSlotStats(ctx, r.pool)
	if err != nil {
		return err
	}
	it, err := r.q.DemoItemStats(ctx, r.pool)
	if err != nil {
		return err
	}
	terms, err := r.q.DemoTerms(ctx, r.pool)
	if err != nil {
		return err
	}
	bound := demoTTL + time.Second
	type row struct {
		What, Value string
		OK          bool
	}
	var rows []row
	check := func(what, value string, ok bool) { rows = append(rows, row{what, value, ok}) }

	check("cron slots run (1s slots, 4 skewed tickers)", fmt.Sprint(slots.Slots), slots.Slots > 0)
	check("most runs of one slot", fmt.Sprint(slots.MaxRunsPerSlot), slots.MaxRunsPerSlot == 1)
	check("overlapping slot runs", fmt.Sprint(slots.Runs-slots.Slots), slots.Runs == slots.Slots)

	increasing := len(terms) >= 2
	for i := 1; i < len(terms); i++ {
		increasing = increasing && terms[i].Term > terms[i-1].Term
	}
	termList := ""
	for _, t := range terms {
		termList += fmt.Sprintf(" %d(w%d)", t.Term, t.Worker)
	}
	check("leader terms (term(worker)), strictly increasing", termList[min(1, len(termList)):], increasing)

	newTerm, err := r.q.DemoTermAfter(ctx, r.pool, demodb.DemoTermAfterParams{Worker: int32(sc.killed), Since: sc.killedAt})
	if err != nil {
		return err
	}
	leaderTakeover := newTerm.Sub(sc.killedAt)
	check("new leader after SIGKILL of the leader", roundDuration(leaderTakeover), newTerm.After(sc.killedAt) && leaderTakeover <= bound)

	if len(sc.killedItems) > 0 {
		// An item whose fenced transaction committed just before the
		// SIGKILL landed is done, not left to take over.
		left, err := r.q.DemoLeftBy(ctx, r.pool, demodb.DemoLeftByParams{Names: sc.killedItems, Worker: int32(sc.killed)})
		if err != nil {
			return err
		}
		if len(left) == 0 {
			check("killed worker's items left to take over", fmt.Sprintf("0 (%d done before the kill)", len(sc.killedItems)), true)
		} else {
			regrant, err := r.q.DemoTakeover(ctx, r.pool, demodb.DemoTakeoverParams{Names: left, Worker: int32(sc.killed), Since: sc.killedAt})
			if err != nil {
				return err
			}
			d := regrant.Sub(sc.killedAt)
			check(fmt.Sprintf("killed worker's %d items taken over after", len(left)), roundDuration(d), regrant.After(sc.killedAt) && d <= bound)
		}
	}
	check("items processed exactly once", fmt.Sprintf("%d/%d", it.Items-it.Doubled, items), int(it.Items) == items && it.Doubled == 0)
	check("items processed twice", fmt.Sprint(it.Doubled), it.Doubled == 0)
	check("workers that processed items", fmt.Sprint(it.Workers), it.Workers >= 2)

	staleOK := len(sc.staleRejected) > 0
	for _, ev := range sc.staleRejected {
		staleOK = staleOK && ev.Token == sc.pausedToken && ev.Item == sc.pausedItem
	}
	check(fmt.Sprintf("stale writes rejected (worker %d, SIGSTOPped holding %s, token %d)", sc.paused, sc.pausedItem, sc.pausedToken),
		fmt.Sprint(len(sc.staleRejected)), staleOK)
	check("stale writes accepted", "0", int(it.Rows) == items) // a stale accept would show as a second row
	check("worker errors", fmt.Sprint(len(sc.errors)), len(sc.errors) == 0)

	fmt.Fprintln(r.stdout)
	failed := 0
	tw := tabwriter.NewWriter(r.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tVALUE\tOK")
	for _, x := range rows {
		mark := "ok"
		if !x.OK {
			mark = "FAILED"
			failed++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", x.What, x.Value, mark)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(r.stdout, "\ndemo finished in %s\n", time.Since(r.start).Round(100*time.Millisecond))
	if failed > 0 {
		return fmt.Errorf("%w: %d checks failed", errInvariant, failed)
	}
	return nil
}

// roundDuration shows a takeover time to a tenth of a second.
func roundDuration(d time.Duration) string { return d.Round(100 * time.Millisecond).String() }
