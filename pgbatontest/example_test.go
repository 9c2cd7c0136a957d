package pgbatontest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/pgbatontest"
)

// exampleClient opens a client on a fresh migrated database; done closes
// it and drops the database. A short TTL: a leader learns of a forced end
// of its term at its next keep-alive, a third of it.
func exampleClient(owner string) (*leasetable.Client, func()) {
	pool, drop := env.ExamplePool()
	c, err := leasetable.New(context.Background(), pool, leasetable.Config{Owner: owner, TTL: 3 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	return c, func() {
		_ = c.Close(context.Background())
		drop()
	}
}

// A job must stop when its lease expires under it; the test does not wait
// a TTL for that.
func ExampleExpire() {
	client, done := exampleClient("worker-1")
	defer done()
	ctx := context.Background()

	lease, err := client.Acquire(ctx, "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	if err := pgbatontest.Expire(ctx, lease); err != nil {
		log.Fatal(err)
	}
	<-lease.Done() // what the job under test waits on
	fmt.Println(errors.Is(lease.Err(), leasetable.ErrLeaseLost))
	// Output: true
}

func ExampleStepClock() {
	client, done := exampleClient("worker-1")
	defer done()
	ctx := context.Background()

	lease, err := client.Acquire(ctx, "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	if err := pgbatontest.StepClock(ctx, lease); err != nil {
		log.Fatal(err)
	}
	fmt.Println(errors.Is(lease.Err(), leasetable.ErrClockStep))
	// Output: true
}

// Another node takes the lease over: the old holder's token is stale from
// now on.
func ExampleTakeOver() {
	client, done := exampleClient("worker-1")
	defer done()
	ctx := context.Background()

	lease, err := client.Acquire(ctx, "shard-7")
	if err != nil {
		log.Fatal(err)
	}
	token, err := pgbatontest.TakeOver(ctx, lease, "worker-2")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(token > lease.Token(), errors.Is(lease.Err(), leasetable.ErrNotHeld))
	// Output: true true
}

func ExampleForceRelease() {
	client, done := exampleClient("worker-1")
	defer done()
	ctx := context.Background()

	lease, err := client.Acquire(ctx, "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	if err := pgbatontest.ForceRelease(ctx, lease, "test: the worker is wedged"); err != nil {
		log.Fatal(err)
	}
	pool, _ := client.Pool()
	h, err := pgbatontest.Holder(ctx, pool, "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(h)
	// Output: free
}

// A service's leader loop, and a test that makes the leader change.
func ExampleChangeLeader() {
	client, done := exampleClient("node-1")
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	terms := make(chan int64, 2)
	campaign, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() {
		stopped <- client.Campaign(campaign, "scheduler", "node-1", pgbaton.Callbacks{
			OnStartedLeading: func(ctx context.Context, term int64) {
				terms <- term
				<-ctx.Done()
			},
		})
	}()
	first := <-terms

	pool, _ := client.Pool()
	h, err := pgbatontest.ChangeLeader(ctx, pool, "scheduler", "test: a new term")
	if err != nil {
		log.Fatal(err)
	}
	second := <-terms // the only candidate leads again, in a new term
	fmt.Println(second > first, second == h.Token, h.Owner)
	stop()
	<-stopped
	// Output: true true node-1
}

func ExampleHolder() {
	client, done := exampleClient("worker-1")
	defer done()
	ctx := context.Background()

	lease, err := client.Acquire(ctx, "shard-7")
	if err != nil {
		log.Fatal(err)
	}
	pool, _ := client.Pool()
	h, err := pgbatontest.Holder(ctx, pool, "shard-7")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(h.Held, h.Owner, h.Token == lease.Token())
	// Output: true worker-1 true
}

// exampleT stands in for the test's *testing.T.
type exampleT struct{}

func (exampleT) Helper()                           {}
func (exampleT) Fatalf(format string, args ...any) { fmt.Printf(format+"\n", args...) }

func ExampleRequireHeld() {
	client, done := exampleClient("worker-1")
	defer done()
	ctx := context.Background()
	t := exampleT{} // in a test: the *testing.T

	lease, err := client.Acquire(ctx, "shard-7")
	if err != nil {
		log.Fatal(err)
	}
	pool, _ := client.Pool()
	token := pgbatontest.RequireHeld(t, pool, "shard-7", "worker-1")
	fmt.Println(token == lease.Token())
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	pgbatontest.RequireFree(t, pool, "shard-7")
	// Output: true
}
