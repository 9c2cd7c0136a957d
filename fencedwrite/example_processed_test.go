package fencedwrite_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton/fencedwrite"
)

// An idempotent consumer: a broker delivers at least once, so the same
// message can arrive twice (a redelivery after a lost ack, a retry, a
// replay). MarkProcessed records the message in the transaction that does
// its work; the second delivery finds the record and is acknowledged
// without doing the work again.
func ExampleMarkProcessed() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE TABLE shipments (order_id text PRIMARY KEY)"); err != nil {
		log.Fatal(err)
	}

	handle := func(messageID, orderID string) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// First: a concurrent duplicate waits here for this transaction.
			if err := fencedwrite.MarkProcessed(ctx, tx, "shipping", messageID); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO shipments VALUES ($1)", orderID)
			return err
		})
	}
	for _, delivery := range []string{"msg-1", "msg-1"} { // delivered twice
		err := handle(delivery, "order-17")
		switch {
		case errors.Is(err, fencedwrite.ErrAlreadyProcessed):
			fmt.Println(delivery, "already processed: ack and skip")
		case err != nil:
			fmt.Println(delivery, "failed, not acked, will come again:", err)
		default:
			fmt.Println(delivery, "processed: ack")
		}
	}

	// Records older than the retention go, in small batches; a pruner runs
	// this periodically.
	if _, err := fencedwrite.PruneProcessed(ctx, pool, fencedwrite.PruneConfig{Retention: fencedwrite.DefaultRetention}); err != nil {
		log.Fatal(err)
	}
	// Output:
	// msg-1 processed: ack
	// msg-1 already processed: ack and skip
}
