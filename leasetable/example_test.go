package leasetable_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/pgbaton/pgbaton/leasetable"
)

// A lease is a named row with an expiry and a fencing token. The holder
// works under lease.Context(), which ends if the lease is lost, and passes
// lease.Token() along with its writes.
func Example() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()

	client, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "node-1", TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	lease, err := client.Acquire(ctx, "nightly-report") // waits while someone else holds it
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holding", lease.Name())

	other, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "node-2"})
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close(ctx)
	_, err = other.TryAcquire(ctx, "nightly-report")
	var held *leasetable.HeldError
	if errors.As(err, &held) {
		fmt.Println("node-2 sees it held by", held.Holder)
	}

	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	<-lease.Done()
	fmt.Println(errors.Is(lease.Err(), leasetable.ErrReleased))
	// Output:
	// holding nightly-report
	// node-2 sees it held by node-1
	// true
}

// Do runs a function under a lease and releases it on every path; the
// function's context ends with ErrLeaseLost if the lease is lost meanwhile.
func ExampleClient_Do() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	client, err := leasetable.New(ctx, pool, leasetable.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	err = client.Do(ctx, "invoice/42#send", func(ctx context.Context) error {
		fmt.Println("sending invoice 42 on one node only")
		return nil
	})
	fmt.Println(err)
	// Output:
	// sending invoice 42 on one node only
	// <nil>
}
