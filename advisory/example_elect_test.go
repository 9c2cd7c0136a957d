package advisory_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/advisory"
)

// Elect blocks until this process leads; Done says when it stops leading.
func ExampleLocker_Elect() {
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

	lead, err := locker.Elect(ctx, advisory.Name("leader:scheduler"))
	if err != nil {
		panic(err)
	}
	fmt.Println("leading")
	if err := lead.Resign(ctx); err != nil {
		panic(err)
	}
	<-lead.Done()
	fmt.Println("resigned")
	// Output:
	// leading
	// resigned
}

// Campaign keeps campaigning until its context ends, running one term at
// a time; a term ends when leadership is lost or OnStartedLeading returns.
func ExampleLocker_Campaign() {
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

	cctx, stop := context.WithCancel(ctx)
	err = locker.Campaign(cctx, advisory.Name("leader:scheduler"), advisory.Callbacks{
		OnStartedLeading: func(ctx context.Context, _ int64) {
			fmt.Println("started leading")
			stop() // a real leader works until ctx ends
			<-ctx.Done()
		},
		OnStoppedLeading: func() { fmt.Println("stopped leading") },
	})
	fmt.Println("campaign:", err)
	// Output:
	// started leading
	// stopped leading
	// campaign: context canceled
}
