package leasetable_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/pgbatontest"
)

// A lock-delay, for a resource that cannot check a fencing token: when a
// holder loses its lease rather than releasing it, nobody is granted the
// lease until the delay has passed after its expiry, so that writes the
// lost holder still had in flight land first. A release frees it at once.
func ExampleConfig_lockDelay() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()

	printer, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "node-1", LockDelay: 2 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer printer.Close(ctx)
	lease, err := printer.Acquire(ctx, "label-printer")
	if err != nil {
		log.Fatal(err)
	}
	// The holder is paused past its lease (here: the test kit's fault).
	if err := pgbatontest.Expire(ctx, lease); err != nil {
		log.Fatal(err)
	}

	other, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "node-2"})
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close(ctx)
	_, err = other.TryAcquire(ctx, "label-printer")
	var held *leasetable.HeldError
	if errors.As(err, &held) && held.LockDelay {
		fmt.Printf("in lock-delay after %s lost it, for %s\n", held.Holder, time.Until(held.ExpiresAt).Round(time.Second))
	}
	next, err := other.Acquire(ctx, "label-printer") // waits through the delay
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("node-2 holds it after the delay")

	if err := next.Release(ctx); err != nil {
		log.Fatal(err)
	}

	// A release frees it at once, whatever the delay.
	again, err := printer.Acquire(ctx, "label-printer")
	if err != nil {
		log.Fatal(err)
	}
	if err := again.Release(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := other.TryAcquire(ctx, "label-printer"); err == nil {
		fmt.Println("node-2 holds it at once after node-1 released it")
	}
	// Output:
	// in lock-delay after node-1 lost it, for 2s
	// node-2 holds it after the delay
	// node-2 holds it at once after node-1 released it
}
