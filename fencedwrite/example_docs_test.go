package fencedwrite_test

// The Go blocks of README.md and docs/ that use fenced writes, each the
// body of a function below that an example runs
// (TestDocsCodeBlocksAreCompiled in the root package checks that the
// blocks and these functions agree).

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/leasetable"
)

// setBalance is README.md's fencedwrite snippet.
func setBalance(ctx context.Context, pool *pgxpool.Pool, lease *leasetable.Lease, id, balance int) error {
	err := fencedwrite.InTx(ctx, pool, lease, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = $1 WHERE id = $2", balance, id)
		return err
	})
	if errors.Is(err, fencedwrite.ErrStaleToken) {
		log.Print("the lease was taken over while we were paused: nothing was written")
	}
	return err
}

// setBalanceSQL is docs/fenced-writes.md's database/sql block.
func setBalanceSQL(ctx context.Context, db *sql.DB, lease *leasetable.Lease, id, balance int) error {
	return fencedwrite.InSQLTx(ctx, db, lease, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = $1 WHERE id = $2", balance, id)
		return err
	})
}

// writeBatches is docs/fenced-writes.md's fenced write loop.
func writeBatches(pool *pgxpool.Pool, lease *leasetable.Lease, batches [][]int) error {
	ctx := lease.Context() // ends when the lease is lost
	for _, batch := range batches {
		err := fencedwrite.InTx(ctx, pool, lease, func(tx pgx.Tx) error {
			return apply(ctx, tx, batch)
		})
		switch {
		case errors.Is(err, fencedwrite.ErrCommitUnknown):
			return err // the connection broke during COMMIT: look at the data before writing this batch again
		case err != nil:
			return err // nothing of this batch was written (ErrStaleToken: never retry with this token)
		case lease.Err() != nil:
			return lease.Err() // this batch was written, but the lease is gone now: stop
		}
	}
	return nil
}

func apply(ctx context.Context, tx pgx.Tx, batch []int) error {
	for _, id := range batch {
		if _, err := tx.Exec(ctx, "INSERT INTO ledger VALUES ($1)", id); err != nil {
			return err
		}
	}
	return nil
}

// takeOne is docs/fenced-writes.md's Guard in a transaction of one's own.
func takeOne(ctx context.Context, pool *pgxpool.Pool, token int64, item string) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if err := fencedwrite.Guard(ctx, tx, "inventory", token); err != nil {
		return err // a *StaleTokenError when the lease moved on: stop, never retry with this token
	}
	if _, err := tx.Exec(ctx, "UPDATE stock SET qty = qty - 1 WHERE item = $1", item); err != nil {
		return err
	}
	return tx.Commit(ctx) // an error here may hide a commit: InTx finds out which
}

// explain is docs/fenced-writes.md's look at a rejection.
func explain(err error) {
	var stale *fencedwrite.StaleTokenError
	if errors.As(err, &stale) {
		fmt.Printf("%s: token %d refused (%s), current %d\n", stale.Name, stale.Presented, stale.Reason, stale.Current)
	}
}

// saveCursor is docs/fenced-writes.md's fenced value.
func saveCursor(ctx context.Context, pool *pgxpool.Pool, lease *leasetable.Lease, lastID int64) error {
	cursor, err := json.Marshal(map[string]int64{"last_id": lastID})
	if err != nil {
		return err
	}
	_, err = fencedwrite.PutValue(ctx, pool, "export/cursor", lease.Token(), cursor)
	return err // ErrStaleToken: a holder with a newer token wrote it since; stop
}

// A holder writes under its lease; once an operator has taken the lease
// away, every write of the old holder is refused.
func Example_docs() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id int PRIMARY KEY, balance int);
		INSERT INTO accounts VALUES (1, 0);
		CREATE TABLE ledger (id int PRIMARY KEY);
		CREATE TABLE stock (item text PRIMARY KEY, qty int);
		INSERT INTO stock VALUES ('bolt', 10)`); err != nil {
		log.Fatal(err)
	}
	client, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "node-1", TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)
	lease, err := client.Acquire(ctx, "ledger")
	if err != nil {
		log.Fatal(err)
	}
	inventory, err := client.Acquire(ctx, "inventory")
	if err != nil {
		log.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()

	fmt.Println("balance:", setBalance(ctx, pool, lease, 1, 100))
	fmt.Println("balance through database/sql:", setBalanceSQL(ctx, db, lease, 1, 200))
	fmt.Println("batches:", writeBatches(pool, lease, [][]int{{1, 2}, {3}}))
	fmt.Println("take one:", takeOne(ctx, pool, inventory.Token(), "bolt"))
	fmt.Println("cursor:", saveCursor(ctx, pool, lease, 3))

	// An operator takes the lease away (a pause past the TTL does the same).
	if _, err := pool.Exec(ctx, "SELECT pgbaton.force_release_lease('ledger', 'example')"); err != nil {
		log.Fatal(err)
	}
	err = setBalance(ctx, pool, lease, 1, 300)
	fmt.Println("stale balance refused:", errors.Is(err, fencedwrite.ErrStaleToken))
	err = writeBatches(pool, lease, [][]int{{4}})
	fmt.Println("stale batch refused:", errors.Is(err, fencedwrite.ErrStaleToken) || errors.Is(err, leasetable.ErrLeaseLost))
	err = takeOne(ctx, pool, inventory.Token()-1, "bolt")
	explain(err)
	// Output:
	// balance: <nil>
	// balance through database/sql: <nil>
	// batches: <nil>
	// take one: <nil>
	// cursor: <nil>
	// stale balance refused: true
	// stale batch refused: true
	// inventory: token 1 refused (superseded), current 2
}

// Message stands for a broker's message.
type Message struct {
	ID     string
	Amount int
}

func (m *Message) Ack()  { fmt.Println(m.ID, "acked") }
func (m *Message) Nack() { fmt.Println(m.ID, "nacked") }

// handleMessage is docs/work-queues.md's idempotent consumer.
func handleMessage(ctx context.Context, pool *pgxpool.Pool, msg *Message) {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := fencedwrite.MarkProcessed(ctx, tx, "billing", msg.ID); err != nil {
			return err // ErrAlreadyProcessed for a repeat: the transaction is aborted
		}
		return charge(ctx, tx, msg)
	})
	switch {
	case err == nil, errors.Is(err, fencedwrite.ErrAlreadyProcessed):
		msg.Ack() // done, now or before
	default:
		msg.Nack() // not done, or done with the reply lost: it comes again, and MarkProcessed tells which
	}
}

func charge(ctx context.Context, tx pgx.Tx, msg *Message) error {
	_, err := tx.Exec(ctx, "INSERT INTO charges VALUES ($1, $2)", msg.ID, msg.Amount)
	return err
}

// A message delivered twice is charged once.
func ExampleMarkProcessed_consumer() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE TABLE charges (message text, amount int)"); err != nil {
		log.Fatal(err)
	}
	msg := &Message{ID: "msg-7", Amount: 30}
	handleMessage(ctx, pool, msg)
	handleMessage(ctx, pool, msg) // redelivered
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM charges").Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("charges:", n)
	// Output:
	// msg-7 acked
	// msg-7 acked
	// charges: 1
}
