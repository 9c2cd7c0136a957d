package advisory_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// SQLSTATE 53200: a server whose shared lock table is tiny fills up; the
// Locker reports ErrLockTableFull, keeps the locks it has, still works,
// and releases everything on Close.
func TestLockTableFull(t *testing.T) {
	c := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true, Settings: map[string]string{
		"max_locks_per_transaction": "10",
		"max_connections":           "20",
	}})
	pool := pgtest.Pool(t, c.URL("postgres"))
	ctx := pgtest.Context(t, time.Minute)
	rec := &logRecorder{}
	l, err := advisory.New(pool, advisory.Config{MaxLocks: 100000, MaxLocksPerSession: 100000, Logger: rec.logger()})
	require.NoError(t, err)
	var held []*advisory.Lock
	var full error
	for i := range 10000 {
		lk, err := l.TryLock(ctx, advisory.Int64(int64(i)))
		if err != nil {
			full = err
			break
		}
		held = append(held, lk)
	}
	require.ErrorIs(t, full, advisory.ErrLockTableFull)
	rec.requireLogged(t, slog.LevelWarn, "lock table full")
	t.Logf("lock table full after %d advisory locks: %v", len(held), full)
	for _, lk := range held {
		require.NoError(t, lk.Err(), "locks taken before stay held")
	}
	// Room again after a release.
	require.NoError(t, held[0].Unlock(ctx))
	lk, err := l.TryLock(ctx, advisory.Int64(-1))
	require.NoError(t, err)
	require.NoError(t, lk.Unlock(ctx))

	require.NoError(t, l.Close(ctx))
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&n))
	require.Zero(t, n)
}

// The Locker's own cap comes before the server's.
func TestMaxLocks(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, time.Minute)
	l := newLocker(t, d.Pool(t), advisory.Config{MaxLocks: 3, MaxLocksPerSession: 2})
	var held []*advisory.Lock
	for i := range 3 {
		lk, err := l.TryLock(ctx, advisory.Int64(int64(i)))
		require.NoError(t, err)
		held = append(held, lk)
	}
	_, err := l.TryLock(ctx, advisory.Int64(3))
	require.ErrorIs(t, err, advisory.ErrLockTableFull)
	_, err = l.Lock(ctx, advisory.Int64(3))
	require.ErrorIs(t, err, advisory.ErrLockTableFull)
	require.NoError(t, held[0].Unlock(ctx))
	lk, err := l.TryLock(ctx, advisory.Int64(3))
	require.NoError(t, err)
	require.NoError(t, lk.Unlock(ctx))
}

func TestStandby(t *testing.T) {
	pool := standbyPool(t)
	ctx := pgtest.Context(t, time.Minute)
	rec := &logRecorder{}
	l := newLocker(t, pool, advisory.Config{Logger: rec.logger()})
	_, err := l.TryLock(ctx, advisory.Int64(1))
	require.ErrorIs(t, err, pgbaton.ErrStandby)
	rec.requireLogged(t, slog.LevelError, "refused")
	_, err = l.Lock(ctx, advisory.Int64(1))
	require.ErrorIs(t, err, pgbaton.ErrStandby)
	_, err = l.TryLock(ctx, advisory.Name("x"))
	require.ErrorIs(t, err, pgbaton.ErrStandby)
	err = l.Campaign(ctx, advisory.Int64(1), advisory.Callbacks{OnStartedLeading: func(context.Context, int64) {}})
	require.ErrorIs(t, err, pgbaton.ErrStandby, "Campaign gives up at once")
	require.False(t, errors.Is(err, context.Canceled))
}
