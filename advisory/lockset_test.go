package advisory_test

import (
	"context"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// TestLockSetBadInput: an empty set, a key given twice (also as a name and
// its bigint), an invalid key or too many keys are refused before anything
// is locked, by every call.
func TestLockSetBadInput(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	l := newLocker(t, pool, advisory.Config{})
	ctx := pgtest.Context(t, time.Minute)
	id, err := advisory.NameKey("", "a")
	require.NoError(t, err)
	many := make([]advisory.Key, advisory.MaxSetKeys+1)
	for i := range many {
		many[i] = advisory.Int64(int64(i))
	}
	tx := begin(t, pool, pgx.TxOptions{})
	for what, keys := range map[string][]advisory.Key{
		"empty": nil, "twice": {advisory.Int64(1), advisory.Int64(2), advisory.Int64(1)},
		"name and its key": {advisory.Name("a"), advisory.Int64(id)}, "zero key": {advisory.Int64(1), {}},
		"empty name": {advisory.Name("")}, "reserved pair": {advisory.Pair(advisory.ReservedPairHi, 1)}, "too many": many,
	} {
		_, err := l.LockAll(ctx, keys...)
		assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "LockAll %s", what)
		_, err = l.TryLockAll(ctx, keys...)
		assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "TryLockAll %s", what)
		assert.ErrorIs(t, l.XactLockAll(ctx, tx, keys...), pgbaton.ErrInvalidArgument, "XactLockAll %s", what)
		assert.ErrorIs(t, l.XactTryLockAll(ctx, tx, keys...), pgbaton.ErrInvalidArgument, "XactTryLockAll %s", what)
	}
	granted, _ := advisoryLocks(t, admin, d)
	assert.Zero(t, granted)
}

// TestTryLockAllAllOrNothing: with one key of the set held by another
// session, TryLockAll returns ErrLocked and holds none of the set; once it
// is free, it takes them all, and Unlock releases them all.
func TestTryLockAllAllOrNothing(t *testing.T) {
	d := env.DB(t)
	admin := adminPool(t)
	a := newLocker(t, d.Pool(t), advisory.Config{})
	b := newLocker(t, d.Pool(t), advisory.Config{})
	ctx := pgtest.Context(t, time.Minute)
	held, err := b.TryLock(ctx, advisory.Int64(20))
	require.NoError(t, err)

	_, err = a.TryLockAll(ctx, advisory.Int64(30), advisory.Int64(20), advisory.Int64(10))
	require.ErrorIs(t, err, advisory.ErrLocked)
	granted, _ := advisoryLocks(t, admin, d)
	assert.Equal(t, 1, granted, "only b's lock is held")

	require.NoError(t, held.Unlock(ctx))
	set, err := a.TryLockAll(ctx, advisory.Int64(30), advisory.Int64(20), advisory.Int64(10))
	require.NoError(t, err)
	var order []string
	for _, lk := range set.Locks() {
		order = append(order, lk.Key().String())
	}
	assert.Equal(t, []string{"key:10", "key:20", "key:30"}, order)
	assert.NoError(t, set.Err())
	granted, _ = advisoryLocks(t, admin, d)
	assert.Equal(t, 3, granted)
	require.NoError(t, set.Unlock(ctx))
	<-set.Done()
	assert.ErrorIs(t, set.Err(), advisory.ErrUnlocked)
	granted, _ = advisoryLocks(t, admin, d)
	assert.Zero(t, granted)
}

// TestLockAllGivesBackOnCancel: a set that waits for a key holds the keys
// before it; when its context ends they are unlocked before LockAll
// returns.
func TestLockAllGivesBackOnCancel(t *testing.T) {
	d := env.DB(t)
	admin := adminPool(t)
	a := newLocker(t, d.Pool(t), advisory.Config{})
	b := newLocker(t, d.Pool(t), advisory.Config{})
	ctx := pgtest.Context(t, time.Minute)
	held, err := b.TryLock(ctx, advisory.Int64(3))
	require.NoError(t, err)
	actx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := a.LockAll(actx, advisory.Int64(3), advisory.Int64(2), advisory.Int64(1))
		got <- err
	}()
	eventuallyWaiting(t, admin, d, 1)
	granted, _ := advisoryLocks(t, admin, d)
	assert.Equal(t, 3, granted, "b's 3, and a's 1 and 2 while it waits for 3")
	cancel()
	assert.ErrorIs(t, <-got, context.Canceled)
	granted, waiting := advisoryLocks(t, admin, d)
	assert.Equal(t, 1, granted, "a holds part of the set")
	assert.Zero(t, waiting)
	require.NoError(t, held.Unlock(ctx))
}

// TestLockAllOppositeOrders: Lockers asking for the same keys in opposite
// orders, over and over, never deadlock.
func TestLockAllOppositeOrders(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, 2*time.Minute)
	orders := [][]advisory.Key{
		{advisory.Name("a"), advisory.Name("b"), advisory.Name("c")},
		{advisory.Name("c"), advisory.Name("b"), advisory.Name("a")},
		{advisory.Name("b"), advisory.Name("c"), advisory.Name("a")},
	}
	const rounds = 30
	var wg sync.WaitGroup
	errs := make(chan error, len(orders))
	for _, keys := range orders {
		l := newLocker(t, d.Pool(t), advisory.Config{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				set, err := l.LockAll(ctx, keys...)
				if err == nil {
					err = set.Unlock(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
}

// TestXactTryLockAllAllOrNothing: in a transaction, a set with one key
// held elsewhere takes none (the savepoint releases the keys taken before
// it) and leaves the transaction usable; the whole set is released when
// the transaction ends.
func TestXactTryLockAllAllOrNothing(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	l := newLocker(t, pool, advisory.Config{})
	ctx := pgtest.Context(t, time.Minute)
	other := begin(t, pool, pgx.TxOptions{})
	require.NoError(t, l.XactTryLock(ctx, other, advisory.Int64(2)))

	tx := begin(t, pool, pgx.TxOptions{})
	err := l.XactTryLockAll(ctx, tx, advisory.Int64(3), advisory.Int64(2), advisory.Int64(1))
	require.ErrorIs(t, err, advisory.ErrLocked)
	granted, _ := advisoryLocks(t, admin, d)
	assert.Equal(t, 1, granted, "tx holds part of the set")
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the transaction is usable")

	require.NoError(t, other.Rollback(ctx))
	require.NoError(t, l.XactTryLockAll(ctx, tx, advisory.Int64(3), advisory.Int64(2), advisory.Int64(1)))
	granted, _ = advisoryLocks(t, admin, d)
	assert.Equal(t, 3, granted)
	require.NoError(t, tx.Commit(ctx))
	granted, _ = advisoryLocks(t, admin, d)
	assert.Zero(t, granted)
}

// TestXactLockAllGivesBackOnCancel: a transaction-scoped set waiting for a
// key is given up when ctx ends: the keys it took are released at once
// (before the transaction ends), and the transaction can go on.
func TestXactLockAllGivesBackOnCancel(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	l := newLocker(t, pool, advisory.Config{})
	ctx := pgtest.Context(t, time.Minute)
	other := begin(t, pool, pgx.TxOptions{})
	require.NoError(t, l.XactTryLock(ctx, other, advisory.Int64(9)))

	tx := begin(t, pool, pgx.TxOptions{})
	actx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() { got <- l.XactLockAll(actx, tx, advisory.Int64(9), advisory.Int64(8)) }()
	eventuallyWaiting(t, admin, d, 1)
	cancel()
	require.ErrorIs(t, <-got, context.Canceled)
	granted, waiting := advisoryLocks(t, admin, d)
	assert.Equal(t, 1, granted, "only other's lock")
	assert.Zero(t, waiting)
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the transaction is usable")
}

// TestXactLockAllOppositeOrders: transactions asking for the same keys in
// opposite orders never deadlock (Postgres would report 40P01 if they
// did).
func TestXactLockAllOppositeOrders(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	ctx := pgtest.Context(t, 2*time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := range 3 {
		keys := []advisory.Key{advisory.Name("x"), advisory.Name("y"), advisory.Name("z" + strconv.Itoa(i%2))}
		if i%2 == 1 {
			keys[0], keys[1] = keys[1], keys[0]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 30 {
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return l.XactLockAll(ctx, tx, keys...) }); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
}

// TestLockAllBehindKilledHolder: a set one of whose keys a killed process
// held is granted as soon as the server sees that process's session end,
// the keys before it held meanwhile.
func TestLockAllBehindKilledHolder(t *testing.T) {
	d := env.DB(t)
	admin := adminPool(t)
	l := newLocker(t, d.Pool(t), advisory.Config{})
	ctx := pgtest.Context(t, time.Minute)
	k := env.StartChild(t, "hold", d.URL, "set:killed")
	k.Expect(t, "locked", 30*time.Second)
	got := make(chan *advisory.LockSet, 1)
	go func() {
		set, err := l.LockAll(ctx, advisory.Name("set:killed"), advisory.Name("set:other"))
		assert.NoError(t, err)
		got <- set
	}()
	eventuallyWaiting(t, admin, d, 1)
	k.Signal(t, syscall.SIGKILL)
	set := <-got
	require.NotNil(t, set)
	assert.NoError(t, set.Err())
	assert.Len(t, set.Locks(), 2)
	require.NoError(t, set.Unlock(ctx))
}
