package fencedwrite_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton/fencedwrite"
)

// A table with a fence_token column remembers the token of each row's last
// writer; with fencing enabled, every UPDATE or DELETE of a fenced row
// must present a token not older than the row's, from any client. (In
// SQL: SELECT pgbaton.enable_fencing('orders').)
func ExampleEnableFencing() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY, status text, fence_token bigint);
		INSERT INTO orders VALUES (1, 'new', 7)`); err != nil {
		log.Fatal(err)
	}
	if err := fencedwrite.EnableFencing(ctx, pool, pgx.Identifier{"orders"}); err != nil {
		log.Fatal(err)
	}

	// An UPDATE presents its token by assigning fence_token.
	_, err := pool.Exec(ctx, "UPDATE orders SET status = 'shipped', fence_token = 8 WHERE id = 1")
	fmt.Println("token 8:", err)
	_, err = pool.Exec(ctx, "UPDATE orders SET status = 'cancelled', fence_token = 7 WHERE id = 1")
	fmt.Println("token 7:", errors.Is(fencedwrite.MapError(err), fencedwrite.ErrStaleToken))
	// One that presents none is refused too.
	_, err = pool.Exec(ctx, "UPDATE orders SET status = 'lost' WHERE id = 1")
	var stale *fencedwrite.StaleTokenError
	fmt.Println("no token:", errors.As(fencedwrite.MapError(err), &stale) && stale.Reason == fencedwrite.ReasonNoToken)

	// A DELETE has no new row: it presents the transaction's token, set
	// with SetToken, or in the statement with pgbaton.present_token.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := fencedwrite.SetToken(ctx, tx, 8); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "DELETE FROM orders WHERE id = 1")
		return err
	})
	fmt.Println("delete with token 8:", err)
	// Output:
	// token 8: <nil>
	// token 7: true
	// no token: true
	// delete with token 8: <nil>
}

// A job's checkpoint outlives each lease on the job. PutValue stores it
// only for a token at least as new as the last writer's, so a paused
// former holder cannot move the checkpoint back.
func ExamplePutValue() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()

	type progress struct {
		LastID int `json:"last_id"`
	}
	save := func(token int64, p progress) error {
		b, err := json.Marshal(p)
		if err != nil {
			return err
		}
		_, err = fencedwrite.PutValue(ctx, pool, "export/checkpoint", token, b)
		return err
	}
	fmt.Println(save(41, progress{LastID: 100})) // holder with token 41
	fmt.Println(save(42, progress{LastID: 250})) // the next holder, token 42
	fmt.Println(save(41, progress{LastID: 120})) // the first holder wakes up

	v, err := fencedwrite.GetValue(ctx, pool, "export/checkpoint")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(v.Data), v.Token)
	// Output:
	// <nil>
	// <nil>
	// fencedwrite: stale fencing token for "export/checkpoint": presented 41, current 42 (older than the value's)
	// {"last_id": 250} 42
}

// CompareAndSwapValue advances a cursor only from the value the caller
// read, and only for a token not older than the last writer's.
func ExampleCompareAndSwapValue() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()

	// nil expected: create only if absent.
	if _, err := fencedwrite.CompareAndSwapValue(ctx, pool, "cursor", 5, nil, json.RawMessage(`10`)); err != nil {
		log.Fatal(err)
	}
	_, err := fencedwrite.CompareAndSwapValue(ctx, pool, "cursor", 5, json.RawMessage(`10`), json.RawMessage(`20`))
	fmt.Println(err)
	_, err = fencedwrite.CompareAndSwapValue(ctx, pool, "cursor", 5, json.RawMessage(`10`), json.RawMessage(`30`))
	fmt.Println(errors.Is(err, fencedwrite.ErrValueChanged))
	// Output:
	// <nil>
	// true
}
