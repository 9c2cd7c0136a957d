package leasetable_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/pgbaton/pgbaton/leasetable"
)

// Shards are registered once as lease rows of a group; each worker claims
// some. A worker that dies frees its shards when their leases expire, and
// the others claim them on their next round.
func ExampleClient_Claim() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()

	worker, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "worker-1", TTL: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer worker.Close(ctx)

	shards := []string{"orders-0", "orders-1", "orders-2", "orders-3"}
	if _, err := worker.Register(ctx, "orders", shards...); err != nil {
		log.Fatal(err)
	}
	mine, err := worker.Claim(ctx, "orders", 2)
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range mine {
		fmt.Println("worker-1 processes", l.Name())
	}
	// A work item that is done is completed: its row goes away.
	if err := mine[0].Complete(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// worker-1 processes orders-0
	// worker-1 processes orders-1
}

// A worker drains a queue of work items: each round completes the batch
// it finished and claims the next in one round trip and one commit.
func ExampleClient_CompleteAndClaim() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	worker, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "mailer-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer worker.Close(ctx)
	if _, err := worker.Register(ctx, "mail", "mail-1", "mail-2", "mail-3"); err != nil {
		log.Fatal(err)
	}

	batch, err := worker.Claim(ctx, "mail", 2)
	for err == nil && len(batch) > 0 {
		for _, l := range batch {
			fmt.Println("send", l.Name())
		}
		batch, err = worker.CompleteAndClaim(ctx, "mail", 2, batch...)
	}
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// send mail-1
	// send mail-2
	// send mail-3
}

// A worker waits in ClaimWait while the queue is empty: it is woken as
// soon as a producer registers items (or another worker releases some, or
// a dead worker's items expire), instead of sleeping and polling.
func ExampleClient_ClaimWait() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	worker, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "mailer-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer worker.Close(ctx)
	producer, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "web-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close(ctx)

	go func() {
		if _, err := producer.Register(ctx, "mail", "mail-1"); err != nil {
			log.Fatal(err)
		}
	}()
	batch, err := worker.ClaimWait(ctx, "mail", 10) // at least one item, or ctx's error
	if err != nil {
		log.Fatal(err)
	}
	for _, item := range batch {
		fmt.Println("send", item.Name())
	}
	if err := worker.Complete(ctx, batch...); err != nil {
		log.Fatal(err)
	}
	// Output:
	// send mail-1
}

// A semaphore lets at most N holders in at once.
func ExampleClient_Semaphore() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	client, err := leasetable.New(ctx, pool, leasetable.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	permit, err := client.Semaphore(ctx, "exporter", 2) // waits while 2 are taken
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("permit", permit.Name())
	_ = permit.Release(ctx)
	// Output:
	// permit exporter#0
}

// Keep holds shards for as long as the worker runs: it claims free ones,
// runs Work for each, and takes over the shards of workers that die when
// their leases expire.
func ExampleClient_Keep() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	worker, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "worker-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer worker.Close(ctx)
	if _, err := worker.Register(ctx, "partitions", "p0", "p1", "p2"); err != nil {
		log.Fatal(err)
	}

	ctx, stop := context.WithCancel(ctx) // the worker's lifetime
	started := make(chan string)
	go func() {
		for range 3 {
			<-started
		}
		stop() // shut down once all three run, for this example
	}()
	err = worker.Keep(ctx, leasetable.KeepConfig{
		Group: "partitions",
		Max:   3,
		Work: func(ctx context.Context, l *leasetable.Lease) {
			started <- l.Name()
			<-ctx.Done() // consume the partition until the lease or the worker ends
		},
	})
	fmt.Println(err)
	// Output:
	// context canceled
}
