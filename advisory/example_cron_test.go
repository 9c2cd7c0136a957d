package advisory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/jobs"
	"github.com/pgbaton/pgbaton/leasetable"
)

// A cron job that every node schedules and that must run once per
// scheduled slot. A skip-if-held lock alone does not give that: a node
// whose ticker fires after another node's run has ended finds the lock
// free and runs the slot again. ClaimSlot is true for exactly one caller
// per (job, slot), however skewed the tickers; the lock then keeps runs of
// the job from overlapping, if that matters too.
func Example_cron() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		panic(err)
	}
	defer locker.Close(ctx)

	tick := func(node string, firedAt time.Time) {
		client, err := leasetable.New(ctx, pool, leasetable.Config{Owner: node})
		if err != nil {
			panic(err)
		}
		defer client.Close(ctx)
		slot := firedAt.Truncate(time.Minute) // the nominal time of an every-minute job
		won, err := jobs.ClaimSlot(ctx, client, "job:report", slot)
		if err != nil {
			panic(err)
		}
		if !won {
			fmt.Println(node, "skips", slot.Format(time.TimeOnly))
			return
		}
		err = locker.RunExclusive(ctx, advisory.Name("job:report"), func(ctx context.Context) error {
			fmt.Println(node, "runs", slot.Format(time.TimeOnly))
			return nil
		}, advisory.RunOptions{})
		if err != nil {
			panic(err)
		}
	}
	// Three nodes' tickers fire for the 12:00 slot, 400ms apart.
	noon := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	tick("node-1", noon.Add(30*time.Millisecond))
	tick("node-2", noon.Add(430*time.Millisecond))
	tick("node-3", noon.Add(830*time.Millisecond))
	// Output:
	// node-1 runs 12:00:00
	// node-2 skips 12:00:00
	// node-3 skips 12:00:00
}
