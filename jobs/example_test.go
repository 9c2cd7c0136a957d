package jobs_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/pgbaton/pgbaton/jobs"
	"github.com/pgbaton/pgbaton/leasetable"
)

// A cron job on many nodes: every node's ticker fires, ClaimSlot lets one
// node take each scheduled slot, and Do records the run with fenced
// checkpoints, so a node that takes over after a crash resumes from the
// last one.
func ExampleDo() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	client, err := leasetable.New(ctx, pool, leasetable.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	slot := time.Date(2026, 1, 1, 3, 0, 0, 0, time.UTC) // the schedule's nominal time
	won, err := jobs.ClaimSlot(ctx, client, "rollup", slot)
	if err != nil || !won {
		return // another node runs this slot
	}
	type progress struct{ LastID int }
	err = jobs.Do(ctx, client, "rollup", func(ctx context.Context, run *jobs.Run) error {
		var p progress
		if _, err := run.LastCheckpoint(&p); err != nil {
			return err
		}
		for id := p.LastID + 1; id <= 3; id++ {
			fmt.Println("rolling up batch", id)
			if err := run.Checkpoint(ctx, progress{LastID: id}); err != nil {
				return err // lease lost: stop, the next holder resumes
			}
		}
		return nil
	})
	fmt.Println(err)
	again, _ := jobs.ClaimSlot(ctx, client, "rollup", slot)
	fmt.Println("slot claimed again:", again)
	// Output:
	// rolling up batch 1
	// rolling up batch 2
	// rolling up batch 3
	// <nil>
	// slot claimed again: false
}
