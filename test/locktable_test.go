package test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/migrations"
)

// SQLSTATE 53200 caused by someone else: another client of the server fills
// the shared lock table with advisory locks. pgbaton's new advisory locks
// fail with the typed ErrLockTableFull; locks and leases already held stay
// held; a lease cannot renew (no write can commit with the table full) and
// its holder learns it lost it; once the other client lets go, everything
// works again.
func TestLockTableFilledByAnotherClient(t *testing.T) {
	url := tinyLockTableCluster(t)
	ctx := pgtest.Context(t, 2*time.Minute)
	pool := pgtest.Pool(t, url)
	_, err := pool.Exec(ctx, "CREATE TABLE full_ledger (token bigint)")
	require.NoError(t, err)

	locker, err := advisory.New(pool, advisory.Config{})
	require.NoError(t, err)
	defer locker.Close(ctx)
	held, err := locker.TryLock(ctx, advisory.Name("full:held"))
	require.NoError(t, err)
	const ttl = 2 * time.Second
	leases, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "full", TTL: ttl})
	require.NoError(t, err)
	defer leases.Close(ctx)
	lease, err := leases.TryAcquire(ctx, "full:lease")
	require.NoError(t, err)

	filler := fillLockTable(t, url)

	_, err = locker.TryLock(ctx, advisory.Int64(42))
	require.ErrorIs(t, err, advisory.ErrLockTableFull)
	require.NoError(t, held.Err(), "a lock held before stays held")
	_, err = locker.TryLock(ctx, advisory.Name("full:held"))
	require.ErrorIs(t, err, advisory.ErrLocked, "and still excludes others")

	// Every write transaction needs a lock-table entry for its own
	// transaction id, so with the table full nothing can write: the lease
	// cannot renew and its holder is told (ErrLeaseLost, never silence),
	// and fenced writes fail without writing anything.
	select {
	case <-lease.Done():
	case <-time.After(2 * ttl):
		t.Fatal("lease neither renewed nor reported lost")
	}
	require.ErrorIs(t, lease.Err(), leasetable.ErrLeaseLost)
	err = fencedwrite.InTx(ctx, pool, lease, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO full_ledger VALUES ($1)", lease.Token())
		return err
	})
	require.Error(t, err)
	t.Logf("fenced write with the lock table full: %v", err)
	_, err = leases.TryAcquire(ctx, "full:other")
	require.Error(t, err)
	t.Logf("lease acquire with the lock table full: %v", err)

	// Recovery once the other client lets go.
	_, err = filler.Exec(ctx, "SELECT pg_advisory_unlock_all()")
	require.NoError(t, err)
	lk, err := locker.TryLock(ctx, advisory.Int64(42))
	require.NoError(t, err)
	require.NoError(t, lk.Unlock(ctx))
	require.NoError(t, held.Unlock(ctx))
	again, err := leases.Acquire(ctx, "full:lease") // free at its expiry
	require.NoError(t, err)
	require.Greater(t, again.Token(), lease.Token())
	require.NoError(t, fencedwrite.InTx(ctx, pool, again, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO full_ledger VALUES ($1)", again.Token())
		return err
	}))
	require.NoError(t, again.Release(ctx))
	var rows []int64
	r, err := pool.Query(ctx, "SELECT token FROM full_ledger")
	require.NoError(t, err)
	rows, err = pgx.CollectRows(r, pgx.RowTo[int64])
	require.NoError(t, err)
	assert.Equal(t, []int64{again.Token()}, rows, "only the write after recovery landed")
	require.NoError(t, locker.Close(ctx))
	// The lease client too: while it listens it holds a listen slot, a
	// session advisory lock of its own (leasetable.Config.ListenSlots).
	require.NoError(t, leases.Close(ctx))
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&n))
	assert.Zero(t, n, "no advisory lock left")
}

// tinyLockTableCluster starts a migrated cluster whose shared lock table
// holds only a few hundred locks.
func tinyLockTableCluster(t *testing.T) string {
	c := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true, Settings: map[string]string{
		"max_locks_per_transaction": "10",
		"max_connections":           "20",
	}})
	url := c.URL("postgres")
	require.NoError(t, migrations.UpURL(pgtest.Context(t, time.Minute), url))
	return url
}

// fillLockTable takes advisory locks on a connection of its own until the
// server answers 53200, and returns that connection (closed when t ends).
func fillLockTable(t *testing.T, url string) *pgx.Conn {
	ctx := pgtest.Context(t, time.Minute)
	filler, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = filler.Close(context.Background()) })
	filled := 0
	for ; filled < 100000; filled += 100 {
		_, err = filler.Exec(ctx, "SELECT count(pg_advisory_lock(g)) FROM generate_series($1::bigint, $1::bigint + 99) g", int64(1_000_000+filled))
		if err != nil {
			break
		}
	}
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "filling the lock table: %v", err)
	require.Equal(t, "53200", pgErr.Code)
	t.Logf("lock table full after about %d advisory locks of another client", filled)
	return filler
}

// With the lock table full, TryLock of a Name key not yet in the registry
// fails while recording the name (the insert needs a lock-table entry
// too); that 53200 must still be ErrLockTableFull. Found by this suite
// (it was a bare "record lock name" error), fixed in advisory 3402f00.
func TestLockTableFullNameKeyTypedError(t *testing.T) {
	url := tinyLockTableCluster(t)
	pool := pgtest.Pool(t, url)
	ctx := pgtest.Context(t, time.Minute)
	locker, err := advisory.New(pool, advisory.Config{})
	require.NoError(t, err)
	defer locker.Close(ctx)
	fillLockTable(t, url)
	_, err = locker.TryLock(ctx, advisory.Name("full:new-name"))
	require.ErrorIs(t, err, advisory.ErrLockTableFull)
}
