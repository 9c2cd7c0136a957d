package advisory_test

// The Go blocks of README.md and docs/ that use advisory locks, each the
// body of a function below that an example runs (TestDocsCodeBlocksAreCompiled
// in the root package checks that the blocks and these functions agree).

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/advisory"
)

// dailyExport is README.md's advisory snippet.
func dailyExport(ctx context.Context, pool *pgxpool.Pool) error {
	locker, err := advisory.New(pool, advisory.Config{}) // one Locker per process
	if err != nil {
		return err
	}
	defer locker.Close(ctx)

	lk, err := locker.TryLock(ctx, advisory.Name("job:daily-export"))
	if errors.Is(err, advisory.ErrLocked) {
		return nil // another node is running it
	}
	if err != nil {
		return err
	}
	defer lk.Unlock(ctx)
	return export(lk.Context()) // lk.Context() ends if the lock is lost (ErrLockLost)
}

func export(ctx context.Context) error {
	fmt.Println("exporting")
	return ctx.Err()
}

// Every node calls dailyExport; while one holds the lock, the others skip.
func Example_skipIfHeld() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	fmt.Println("alone:", dailyExport(ctx, pool))

	other, err := advisory.New(pool, advisory.Config{Owner: "node-2"})
	if err != nil {
		panic(err)
	}
	defer other.Close(ctx)
	held, err := other.TryLock(ctx, advisory.Name("job:daily-export"))
	if err != nil {
		panic(err)
	}
	fmt.Println("while node-2 holds it:", dailyExport(ctx, pool))
	_ = held.Unlock(ctx)
	// Output:
	// exporting
	// alone: <nil>
	// while node-2 holds it: <nil>
}

// reindexOnce is docs/cron-jobs.md's RunExclusive block.
func reindexOnce(ctx context.Context, locker *advisory.Locker) error {
	err := locker.RunExclusive(ctx, advisory.Name("job:reindex"), func(ctx context.Context) error {
		return reindex(ctx) // ctx ends, with cause ErrLockLost, if the lock is lost
	}, advisory.RunOptions{}) // skip if held; RunOptions{Wait: true} waits for it
	if errors.Is(err, advisory.ErrLocked) {
		return nil // another node is running it
	}
	return err // wraps ErrLockLost if the lock was lost before reindex returned
}

func reindex(ctx context.Context) error {
	fmt.Println("reindexing")
	return ctx.Err()
}

// settleAccount is docs/cron-jobs.md's transaction-scoped lock.
func settleAccount(ctx context.Context, pool *pgxpool.Pool, locker *advisory.Locker) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := locker.XactLock(ctx, tx, advisory.Name("account:42")); err != nil {
			return err
		}
		return settle(ctx, tx, 42) // the lock is released when tx commits or rolls back
	})
}

func settle(ctx context.Context, tx pgx.Tx, account int) error {
	fmt.Println("settling account", account)
	_, err := tx.Exec(ctx, "SELECT 1")
	return err
}

// lead is docs/leader-election.md's advisory election.
func lead(ctx context.Context, locker *advisory.Locker) error {
	leadership, err := locker.Elect(ctx, advisory.Name("leader:scheduler")) // waits until this process leads
	if err != nil {
		return err
	}
	defer leadership.Resign(ctx)
	return schedule(leadership.Context()) // ends when leadership is lost: the session died (ErrLockLost)
}

func schedule(ctx context.Context) error {
	fmt.Println("leading")
	return ctx.Err()
}

// The blocks of docs/cron-jobs.md and docs/leader-election.md, run.
func Example_docs() {
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

	fmt.Println(reindexOnce(ctx, locker))
	fmt.Println(settleAccount(ctx, pool, locker))
	fmt.Println(lead(ctx, locker))
	// Output:
	// reindexing
	// <nil>
	// settling account 42
	// <nil>
	// leading
	// <nil>
}
