package advisory_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/advisory"
)

// A transaction-scoped lock lives as long as the caller's transaction:
// it works behind PgBouncer transaction pooling, where session locks
// cannot.
func ExampleLocker_XactLock() {
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
		if err := locker.XactLock(ctx, tx, advisory.Name("account:42")); err != nil {
			return err
		}
		fmt.Println("updating account 42 under the lock")
		return nil
	}) // released at commit
	fmt.Println("err:", err)
	// Output:
	// updating account 42 under the lock
	// err: <nil>
}
