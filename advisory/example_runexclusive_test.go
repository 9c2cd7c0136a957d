package advisory_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/advisory"
)

// RunExclusive runs a function under a lock and unlocks on every path.
// The function's context ends if the lock is lost; the error then says
// so, and a queue consumer must not acknowledge the message.
func ExampleLocker_RunExclusive() {
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

	err = locker.RunExclusive(ctx, advisory.Name("order:1234#ship"), func(ctx context.Context) error {
		fmt.Println("shipping order 1234")
		return ctx.Err()
	}, advisory.RunOptions{Wait: true})
	fmt.Println("err:", err)
	// Output:
	// shipping order 1234
	// err: <nil>
}
