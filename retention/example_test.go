package retention_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/retention"
)

// A service prunes in the background: Run on every node, one prunes at a
// time. Prune is one pass, for a scheduled job of your own.
func ExampleRun() {
	pool, done := examplePool()
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	client, err := leasetable.New(ctx, pool, leasetable.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(context.Background())

	// Cron slots kept a day, job runs a week; the rest by default.
	cfg := retention.Config{CronSlots: 24 * time.Hour, JobRuns: 7 * 24 * time.Hour}
	go func() {
		if err := retention.Run(ctx, client, cfg); err != nil && ctx.Err() == nil {
			log.Print(err)
		}
	}()

	pruned, err := retention.Prune(ctx, pool, cfg)
	fmt.Println(pruned["cron_slot"], err)
	// Output: 0 <nil>
}
