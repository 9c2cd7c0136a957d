package leasetable_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton/leasetable"
)

// A worker loop with exactly-once effects: each item's effect and its
// completion commit in one transaction. A worker killed at any instant
// leaves its item either done and completed, or neither (claimed again by
// another worker when the lease's TTL runs out) — never done twice. If the
// lease was taken over meanwhile (the worker was paused past its TTL),
// CompleteTx fails and aborts the transaction, so the effect is not
// committed either.
func ExampleClient_CompleteTx() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE TABLE sent (mail text PRIMARY KEY)"); err != nil {
		log.Fatal(err)
	}
	worker, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "mailer-1", TTL: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer worker.Close(ctx)
	if _, err := worker.Register(ctx, "mail", "mail-1", "mail-2", "mail-3"); err != nil {
		log.Fatal(err)
	}

	for {
		batch, err := worker.Claim(ctx, "mail", 2)
		if err != nil {
			log.Fatal(err)
		}
		if len(batch) == 0 {
			break // a long-running worker calls ClaimWait instead, which waits for items
		}
		for _, item := range batch {
			// The transaction runs under the lease's context: if the lease
			// is lost, the work stops and nothing commits.
			err := pgx.BeginFunc(item.Context(), pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "INSERT INTO sent VALUES ($1)", item.Name()); err != nil {
					return err
				}
				return worker.CompleteTx(ctx, tx, item)
			})
			if err != nil {
				log.Printf("%s not done, another worker will: %v", item.Name(), err)
				continue
			}
			fmt.Println("sent", item.Name())
		}
	}
	// Output:
	// sent mail-1
	// sent mail-2
	// sent mail-3
}
