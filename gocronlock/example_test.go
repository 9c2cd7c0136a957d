package gocronlock_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgbaton/pgbaton/gocronlock"
	"github.com/pgbaton/pgbaton/leasetable"
)

// Two schedulers, as on two nodes, run the same every-second job; with the
// Locker each tick runs once, on one of them.
func Example() {
	pool, done := env.ExamplePool()
	defer done()
	ctx := context.Background()

	var mu sync.Mutex
	runsPerTick := map[time.Time]int{}
	job := func() {
		mu.Lock()
		defer mu.Unlock()
		runsPerTick[time.Now().Truncate(time.Second)]++
	}
	var schedulers []gocron.Scheduler
	for _, node := range []string{"node-1", "node-2"} {
		client, err := leasetable.New(ctx, pool, leasetable.Config{Owner: node})
		if err != nil {
			log.Fatal(err)
		}
		defer client.Close(ctx)
		locker, err := gocronlock.NewLocker(client, gocronlock.Config{MinHold: 500 * time.Millisecond})
		if err != nil {
			log.Fatal(err)
		}
		defer locker.Close(ctx)
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
		if err != nil {
			log.Fatal(err)
		}
		_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(job), gocron.WithName("report"))
		if err != nil {
			log.Fatal(err)
		}
		s.Start()
		schedulers = append(schedulers, s)
	}
	time.Sleep(3500 * time.Millisecond) // let three ticks pass
	for _, s := range schedulers {
		_ = s.Shutdown()
	}
	mu.Lock()
	defer mu.Unlock()
	once := len(runsPerTick) >= 3
	for _, n := range runsPerTick {
		once = once && n == 1
	}
	fmt.Println("every tick ran once:", once)
	// Output: every tick ran once: true
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
