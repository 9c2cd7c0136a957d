package gocronlock_test

// docs/cron-jobs.md's gocron block is the body of runScheduler below, which
// an example runs (TestDocsCodeBlocksAreCompiled in the root module checks
// that the two agree).

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgbaton/pgbaton/gocronlock"
	"github.com/pgbaton/pgbaton/leasetable"
)

// runScheduler is docs/cron-jobs.md's gocron scheduler, run on every node.
func runScheduler(ctx context.Context, client *leasetable.Client) error {
	locker, err := gocronlock.NewLocker(client, gocronlock.Config{})
	if err != nil {
		return err
	}
	s, err := locker.NewScheduler() // gocron.WithDistributedLocker(locker), bound to it
	if err != nil {
		return err
	}
	_, err = s.NewJob(gocron.CronJob("*/5 * * * *", false), gocron.NewTask(rollup), gocron.WithName("rollup"))
	if err != nil {
		return err
	}
	s.Start()
	<-ctx.Done() // until the service stops
	return errors.Join(s.Shutdown(), locker.Close(context.Background()))
}

func rollup() { fmt.Println("rolling up") }

// The scheduler starts, waits for its first slot, and stops cleanly.
func Example_scheduler() {
	pool, done := env.ExamplePool()
	defer done()
	ctx := context.Background()
	client, err := leasetable.New(ctx, pool, leasetable.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	sctx, stop := context.WithTimeout(ctx, 100*time.Millisecond)
	defer stop()
	fmt.Println(runScheduler(sctx, client))
	// Output: <nil>
}
