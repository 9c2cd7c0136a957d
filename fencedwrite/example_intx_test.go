package fencedwrite_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/leasetable"
)

// A holder writes under its lease with InTx: the write commits only while
// the lease is still this grant's. A holder that was paused past its lease
// and wakes up after a takeover gets ErrStaleToken and writes nothing.
func ExampleInTx() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE TABLE payouts (id int PRIMARY KEY, paid_by bigint)"); err != nil {
		log.Fatal(err)
	}

	node1, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "node-1", TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer node1.Close(ctx)
	lease, err := node1.TryAcquire(ctx, "payouts")
	if err != nil {
		log.Fatal(err)
	}

	pay := func(l fencedwrite.Lease, id int) error {
		return fencedwrite.InTx(ctx, pool, l, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO payouts VALUES ($1, $2)", id, l.Token())
			return err
		})
	}
	if err := pay(lease, 1); err != nil {
		log.Fatal(err)
	}
	fmt.Println("node-1 paid 1")

	// node-1 stalls; its lease ends and node-2 takes over. (Here node-1
	// releases, to keep the example fast; an expiry looks the same.)
	stale := fencedwrite.Token(lease.Name(), lease.Token())
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	node2, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "node-2", TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer node2.Close(ctx)
	newer, err := node2.TryAcquire(ctx, "payouts")
	if err != nil {
		log.Fatal(err)
	}
	if err := pay(newer, 2); err != nil {
		log.Fatal(err)
	}
	fmt.Println("node-2 paid 2")

	// node-1 wakes up and tries to pay again with its old token.
	err = pay(stale, 2)
	var staleErr *fencedwrite.StaleTokenError
	if errors.As(err, &staleErr) {
		fmt.Println("node-1 refused:", staleErr.Reason, staleErr.Presented < staleErr.Current)
	}
	// Output:
	// node-1 paid 1
	// node-2 paid 2
	// node-1 refused: superseded true
}

// Guard in a transaction you manage yourself: call it before the writes.
// Until the transaction ends nobody can take the lease over.
func ExampleGuard() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	var token int64 // from leasetable, or passed along in a message
	if err := pool.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire('inventory', 'node-1', 10000)").Scan(&token); err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := fencedwrite.Guard(ctx, tx, "inventory", token); err != nil {
		log.Fatal(err) // errors.Is(err, fencedwrite.ErrStaleToken): stop, do not retry
	}
	if _, err := tx.Exec(ctx, "CREATE TABLE stock AS SELECT 1 AS item, 10 AS qty"); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("committed under token", token)
	// Output:
	// committed under token 1
}

// From any client, the fence is one SQL function in the statement itself:
// no extra round trip. MapError turns its SQLSTATE PB001 into a
// *StaleTokenError.
func ExampleMapError() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE TABLE accounts (id int PRIMARY KEY, balance int)"); err != nil {
		log.Fatal(err)
	}
	var token int64
	if err := pool.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire('accounts', 'node-1', 10000)").Scan(&token); err != nil {
		log.Fatal(err)
	}

	const update = `INSERT INTO accounts SELECT $1, $2 WHERE pgbaton.assert_token('accounts', $3)`
	_, err := pool.Exec(ctx, update, 1, 100, token)
	fmt.Println(err)
	_, err = pool.Exec(ctx, update, 2, 100, token+1)
	fmt.Println(fencedwrite.MapError(err))
	// Output:
	// <nil>
	// fencedwrite: stale fencing token for "accounts": presented 2, current 1 (not granted)
}
