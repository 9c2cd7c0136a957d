package jobs_test

// The Go blocks of docs/cron-jobs.md that use package jobs, each the body
// of a function below that an example runs (TestDocsCodeBlocksAreCompiled
// in the root package checks that the blocks and these functions agree).

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/pgbaton/pgbaton/jobs"
	"github.com/pgbaton/pgbaton/leasetable"
)

// reportEveryMinute is docs/cron-jobs.md's cron loop.
func reportEveryMinute(ctx context.Context, client *leasetable.Client, ticks <-chan time.Time) {
	for tick := range ticks { // time.NewTicker(time.Minute).C, on every node
		slot := tick.Truncate(time.Minute) // the nominal time: the same on every node
		won, err := jobs.ClaimSlot(ctx, client, "report", slot)
		if err != nil {
			log.Printf("report %s: %v", slot, err) // this node skips the slot
			continue
		}
		if !won {
			continue // another node has this slot
		}
		if err := report(ctx, slot); err != nil {
			log.Printf("report %s: %v", slot, err)
		}
	}
}

func report(_ context.Context, slot time.Time) error {
	fmt.Println("report for", slot.Format(time.TimeOnly))
	return nil
}

// Three nodes' tickers fire for the same minutes, hundreds of milliseconds
// apart; each slot runs once.
func ExampleClaimSlot() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()

	noon := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for i, node := range []string{"node-1", "node-2", "node-3"} {
		client, err := leasetable.New(ctx, pool, leasetable.Config{Owner: node})
		if err != nil {
			log.Fatal(err)
		}
		defer client.Close(ctx)
		skew := time.Duration(i) * 400 * time.Millisecond
		ticks := make(chan time.Time, 2)
		ticks <- noon.Add(skew)
		ticks <- noon.Add(time.Minute + skew)
		close(ticks)
		reportEveryMinute(ctx, client, ticks)
	}
	// Output:
	// report for 12:00:00
	// report for 12:01:00
}

// rollupDays is docs/cron-jobs.md's job with checkpoints.
func rollupDays(ctx context.Context, client *leasetable.Client, days int) error {
	return jobs.Do(ctx, client, "rollup", func(ctx context.Context, run *jobs.Run) error {
		var done struct{ Days int }
		if _, err := run.LastCheckpoint(&done); err != nil { // where an unfinished run stopped, if one did
			return err
		}
		for day := done.Days; day < days; day++ {
			if err := rollup(ctx, day); err != nil {
				return err // the run is recorded as failed; the next one resumes at this day
			}
			done.Days = day + 1
			if err := run.Checkpoint(ctx, done); err != nil {
				return err // the lease was lost: stop; whoever took over resumes from the last checkpoint
			}
		}
		return nil
	})
}

var failDay = 2 // rollup fails once, on this day

func rollup(_ context.Context, day int) error {
	if day == failDay {
		failDay = -1
		return errors.New("disk full")
	}
	fmt.Println("rolled up day", day)
	return nil
}

// A run that fails leaves its checkpoint; the next run resumes from it.
func ExampleDo_resume() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	client, err := leasetable.New(ctx, pool, leasetable.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	fmt.Println("first run:", rollupDays(ctx, client, 4))
	fmt.Println("second run:", rollupDays(ctx, client, 4))
	runs, err := jobs.Runs(ctx, client, "rollup", 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range runs {
		fmt.Printf("%s %q\n", r.Status, r.Error)
	}
	// Output:
	// rolled up day 0
	// rolled up day 1
	// first run: disk full
	// rolled up day 2
	// rolled up day 3
	// second run: <nil>
	// succeeded ""
	// failed "disk full"
}
