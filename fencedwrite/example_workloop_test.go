package fencedwrite_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/leasetable"
)

// syncBatches writes batches while holding lease: each batch in a
// transaction fenced by the lease, so a holder that was paused past its
// lease and taken over cannot commit a single row more.
func syncBatches(ctx context.Context, pool *pgxpool.Pool, lease *leasetable.Lease, batches <-chan int) error {
	for batch := range batches {
		err := fencedwrite.InTx(lease.Context(), pool, lease, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO ledger (batch) VALUES ($1)", batch)
			return err
		})
		switch {
		case errors.Is(err, fencedwrite.ErrStaleToken), err != nil && lease.Err() != nil:
			// The lease moved on (the database said so, or the client
			// learnt it first and ended lease.Context()): nothing of this
			// batch was written. Stop; never retry with this token.
			return fmt.Errorf("batch %d: lease lost, nothing written: %w", batch, errors.Join(err, lease.Err()))
		case err == nil && lease.Err() != nil:
			// This batch committed under the lease, which is gone now:
			// stop before the next.
			return fmt.Errorf("batch %d written, then the lease was lost: %w", batch, lease.Err())
		case errors.Is(err, fencedwrite.ErrCommitUnknown):
			// The connection broke during COMMIT and nobody could tell how
			// it went: look at the data before writing the batch again.
			return err
		case err != nil:
			return err // nothing written
		}
		fmt.Println("batch", batch, "written")
	}
	return nil
}

// The fenced write loop: take a lease, write under it batch by batch, stop
// at the first stale token.
func ExampleInTx_loop() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE TABLE ledger (batch int PRIMARY KEY)"); err != nil {
		log.Fatal(err)
	}
	client, err := leasetable.New(ctx, pool, leasetable.Config{TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)
	lease, err := client.Acquire(ctx, "ledger-sync")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	batches := make(chan int, 2)
	batches <- 1
	batches <- 2
	close(batches)
	if err := syncBatches(ctx, pool, lease, batches); err != nil {
		log.Fatal(err)
	}
	// Then the lease is taken away (here by an operator; a pause past the
	// TTL does the same) and granted a new token.
	if _, err := pool.Exec(ctx, "SELECT pgbaton.force_release_lease('ledger-sync', 'example')"); err != nil {
		log.Fatal(err)
	}
	more := make(chan int, 1)
	more <- 3
	close(more)
	err = syncBatches(ctx, pool, lease, more)
	fmt.Println("stopped:", errors.Is(err, fencedwrite.ErrStaleToken) || errors.Is(err, leasetable.ErrLeaseLost))
	// Output:
	// batch 1 written
	// batch 2 written
	// stopped: true
}
