package leasetable_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/pgbaton/pgbaton/leasetable"
)

// AcquireAll takes several leases at once, all of them or none, in one
// order whatever order they are asked in: two transfers between the same
// accounts, one asking for {from, to} and the other for {to, from}, never
// deadlock and never starve each other.
func ExampleClient_AcquireAll() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	client, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "node-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	if err := transfer(ctx, client, "account:7", "account:42", 100); err != nil {
		log.Fatal(err)
	}
	// Output:
	// holding account:42
	// holding account:7
	// moving 100 from account:7 to account:42
}

func transfer(ctx context.Context, client *leasetable.Client, from, to string, amount int) error {
	set, err := client.AcquireAll(ctx, from, to) // waits; every lease or none
	if err != nil {
		return err
	}
	defer set.Release(ctx)
	for _, lease := range set.Leases() { // in byte order, each with its own token
		fmt.Println("holding", lease.Name())
	}
	return move(set.Context(), from, to, amount) // set.Context() ends when any lease of the set ends
}

// move stands for the work done under the set.
func move(ctx context.Context, from, to string, amount int) error {
	fmt.Println("moving", amount, "from", from, "to", to)
	return ctx.Err()
}

// TryAcquireAll takes every lease in one statement, or none: when one is
// held, the HeldError names it, and nothing of the set is held.
func ExampleClient_TryAcquireAll() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	a, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "node-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close(ctx)
	b, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "node-2"})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close(ctx)

	if _, err := b.TryAcquire(ctx, "shard:2"); err != nil {
		log.Fatal(err)
	}
	_, err = a.TryAcquireAll(ctx, "shard:1", "shard:2", "shard:3")
	var held *leasetable.HeldError
	if errors.As(err, &held) {
		fmt.Println(held.Name, "is held by", held.Holder, "so node-1 holds none of the set")
	}
	// Output:
	// shard:2 is held by node-2 so node-1 holds none of the set
}
