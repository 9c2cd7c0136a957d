package advisory_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/advisory"
)

// LockAll takes several locks at once, all of them or none, in one order
// whatever order they are asked in, so sets that share keys never
// deadlock.
func ExampleLocker_LockAll() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		panic(err)
	}
	defer locker.Close(ctx)

	set, err := locker.LockAll(ctx, advisory.Name("account:7"), advisory.Name("account:42")) // waits; every lock or none
	if err != nil {
		panic(err)
	}
	fmt.Println("holding", len(set.Locks()), "locks") // work under set.Context(): it ends when any lock is lost
	if err := set.Unlock(ctx); err != nil {
		panic(err)
	}
	// Output:
	// holding 2 locks
}

// XactLockAll takes several transaction-scoped locks, all or none, in the
// caller's transaction: a failure rolls back to a savepoint taken before
// the first, so the transaction holds none of the set and goes on.
func ExampleLocker_XactLockAll() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		panic(err)
	}
	defer locker.Close(ctx)

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := locker.XactLockAll(ctx, tx, advisory.Name("account:7"), advisory.Name("account:42")); err != nil {
			return err
		}
		fmt.Println("moving money between accounts 7 and 42")
		return nil
	}) // both released at commit
	fmt.Println("err:", err)
	// Output:
	// moving money between accounts 7 and 42
	// err: <nil>
}
