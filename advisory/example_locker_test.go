package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/advisory"
)

// Work that every node attempts but that must never run on two at once:
// TryLock, and skip when another node has it. (A cron job that must run
// once per scheduled slot needs more: see Example_cron.)
func ExampleLocker_TryLock() {
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

	lk, err := locker.TryLock(ctx, advisory.Name("job:daily-export"))
	if errors.Is(err, advisory.ErrLocked) {
		fmt.Println("another node runs the export")
		return
	}
	if err != nil {
		panic(err)
	}
	defer lk.Unlock(ctx)

	// Work while the lock is held; stop when it is lost.
	select {
	case <-lk.Done():
		fmt.Println("lost:", lk.Err())
	default:
		fmt.Println("exporting")
	}

	// A second attempt, even from this process, finds it held.
	_, err = locker.TryLock(ctx, advisory.Name("job:daily-export"))
	fmt.Println(errors.Is(err, advisory.ErrLocked))
	// Output:
	// exporting
	// true
}

// Lock waits, here at most a second, on a connection of its own.
func ExampleLocker_Lock() {
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

	held, err := locker.Lock(ctx, advisory.Pair(42, 7)) // e.g. (table id, shard)
	if err != nil {
		panic(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = locker.Lock(wctx, advisory.Pair(42, 7))
	fmt.Println("second wait:", errors.Is(err, context.DeadlineExceeded))

	if err := held.Unlock(ctx); err != nil {
		panic(err)
	}
	lk, err := locker.Lock(ctx, advisory.Pair(42, 7))
	if err != nil {
		panic(err)
	}
	fmt.Println("acquired after unlock:", lk.Err() == nil)
	_ = lk.Unlock(ctx)
	// Output:
	// second wait: true
	// acquired after unlock: true
}

// Readers share a lock; a writer excludes them.
func ExampleLocker_RLock() {
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

	key := advisory.Name("config:reload")
	r1, _ := locker.RLock(ctx, key)
	r2, _ := locker.TryRLock(ctx, key)
	_, err = locker.TryLock(ctx, key)
	fmt.Println("writer while read:", errors.Is(err, advisory.ErrLocked))
	_ = r1.Unlock(ctx)
	_ = r2.Unlock(ctx)
	w, err := locker.TryLock(ctx, key)
	fmt.Println("writer after readers:", err == nil)
	_ = w.Unlock(ctx)
	// Output:
	// writer while read: true
	// writer after readers: true
}
