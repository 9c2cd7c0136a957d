package gocronlock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgbaton/pgbaton/gocronlock"
	"github.com/pgbaton/pgbaton/leasetable"
)

// Two schedulers, as on two nodes, run the same every-second job; each
// scheduled second runs on one of them only.
func Example() {
	pool, done := env.ExamplePool()
	defer done()
	ctx := context.Background()

	ran := make(chan string, 10)
	var schedulers []gocron.Scheduler
	for _, node := range []string{"node-1", "node-2"} {
		client, err := leasetable.New(ctx, pool, leasetable.Config{Owner: node})
		if err != nil {
			log.Fatal(err)
		}
		defer client.Close(ctx)
		locker, err := gocronlock.NewLocker(client, gocronlock.Config{})
		if err != nil {
			log.Fatal(err)
		}
		defer locker.Close(ctx)
		s, err := locker.NewScheduler() // gocron.WithDistributedLocker(locker), bound to it
		if err != nil {
			log.Fatal(err)
		}
		_, err = s.NewJob(gocron.CronJob("* * * * * *", true),
			gocron.NewTask(func() { ran <- node }), gocron.WithName("report"))
		if err != nil {
			log.Fatal(err)
		}
		s.Start()
		schedulers = append(schedulers, s)
	}
	<-ran
	fmt.Println("report ran on one node")
	for _, s := range schedulers {
		_ = s.Shutdown()
	}
	// Output: report ran on one node
}

// With an Elector, only the leader's scheduler runs jobs.
func ExampleNewElector() {
	pool, done := env.ExamplePool()
	defer done()
	ctx := context.Background()

	client, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "node-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)
	elector, err := gocronlock.NewElector(client, "scheduler-leader")
	if err != nil {
		log.Fatal(err)
	}
	defer elector.Close()
	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Shutdown()
	for elector.IsLeader(ctx) != nil { // alone, it wins at once
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("leader")
	// Output: leader
}
