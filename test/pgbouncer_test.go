package test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// bouncerPool connects through PgBouncer the way an application behind a
// transaction pooler must: PgBouncer 1.18 keeps no prepared statements
// across transactions, so statements go out in the simple protocol.
func bouncerPool(t *testing.T, url string) *pgxpool.Pool {
	return pgtest.Pool(t, url, func(c *pgxpool.Config) {
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		c.MaxConns = 4
	})
}

// Behind PgBouncer in transaction pooling mode, session advisory locks
// would be taken and released on random backends: the Locker refuses them
// with ErrSessionPooling. Transaction-scoped locks, leases and fenced
// writes work.
func TestPgBouncerTransactionPooling(t *testing.T) {
	d := env.DB(t)
	url := pgtest.StartPgBouncer(t, d)
	ctx := ctxT(t, 2*time.Minute)
	pool := bouncerPool(t, url)

	t.Run("session locks refused", func(t *testing.T) {
		refused := lockBehindBouncer(t, ctx, pool, url)
		require.ErrorIs(t, refused, advisory.ErrSessionPooling)
	})

	t.Run("xact locks work", func(t *testing.T) {
		locker, err := advisory.New(pool, advisory.Config{})
		require.NoError(t, err)
		defer locker.Close(ctx)
		key := advisory.Name("bouncer:xact")
		tx1, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, locker.XactTryLock(ctx, tx1, key))
		tx2, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.ErrorIs(t, locker.XactTryLock(ctx, tx2, key), advisory.ErrLocked)
		require.NoError(t, tx2.Rollback(ctx))
		require.NoError(t, tx1.Commit(ctx))
		tx3, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, locker.XactTryLock(ctx, tx3, key), "free again once the holding transaction ended")
		require.NoError(t, tx3.Commit(ctx))
	})

	t.Run("leases and fenced writes work", func(t *testing.T) {
		const ttl = 2 * time.Second
		a, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "bouncer-a", TTL: ttl})
		require.NoError(t, err)
		defer a.Close(ctx)
		b, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "bouncer-b", TTL: ttl})
		require.NoError(t, err)
		defer b.Close(ctx)
		la, err := a.TryAcquire(ctx, "bouncer:lease")
		require.NoError(t, err)
		_, err = b.TryAcquire(ctx, "bouncer:lease")
		require.ErrorIs(t, err, leasetable.ErrHeld)
		_, err = pool.Exec(ctx, "CREATE TABLE bouncer_ledger (token bigint)")
		require.NoError(t, err)
		require.NoError(t, fencedwrite.InTx(ctx, pool, la, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO bouncer_ledger VALUES ($1)", la.Token())
			return err
		}))
		// Renewals keep it past its TTL, through the pooler.
		time.Sleep(ttl + ttl/2) // the wait is the point: outlive one TTL
		require.NoError(t, la.Err())
		require.NoError(t, la.Release(ctx))
		start := time.Now()
		lb, err := b.Acquire(ctx, "bouncer:lease")
		require.NoError(t, err)
		assert.Less(t, time.Since(start), ttl, "released lease granted at once")
		assert.Greater(t, lb.Token(), la.Token())
		err = fencedwrite.InTx(ctx, pool, la, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO bouncer_ledger VALUES ($1)", la.Token())
			return err
		})
		require.ErrorIs(t, err, fencedwrite.ErrStaleToken)
		require.NoError(t, lb.Release(ctx))
	})
}

// lockBehindBouncer takes session locks through a transaction pooler until
// the Locker notices, and returns the refusal, with the Locker closed.
// Another client keeps a backend busy in a transaction, so consecutive
// statements of the Locker's session land on different backends, as they
// do in production under load.
func lockBehindBouncer(t *testing.T, ctx context.Context, pool *pgxpool.Pool, url string) error {
	busy := bouncerPool(t, url)
	tx, err := busy.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SELECT 1")
	require.NoError(t, err)

	locker, err := advisory.New(pool, advisory.Config{})
	require.NoError(t, err)
	defer locker.Close(ctx)
	var refused error
	for i := range 20 { // a pid change may take a few statements to show
		lk, err := locker.TryLock(ctx, advisory.Name(fmt.Sprintf("bouncer:%d", i)))
		if err != nil {
			refused = err
			break
		}
		select {
		case <-lk.Done():
			refused = lk.Err()
		case <-time.After(3 * time.Second): // a few pings
		}
		if refused != nil {
			break
		}
	}
	t.Logf("refused: %v", refused)
	require.NoError(t, locker.Close(ctx))
	return refused
}

// Behind PgBouncer in transaction mode no session lock may stay behind on
// the pooler's server connections, which outlive the client
// (server_lifetime, an hour by default) and would block every other client
// of those keys. Found by this suite: the Locker used to grant the first
// locks and notice the pooler only at a later ping, leaving them held;
// since advisory f08ff88 it probes before the first lock.
func TestPgBouncerRefusedSessionLeavesNoLocks(t *testing.T) {
	d := env.DB(t)
	url := pgtest.StartPgBouncer(t, d)
	ctx := ctxT(t, 2*time.Minute)
	pool := bouncerPool(t, url)
	refused := lockBehindBouncer(t, ctx, pool, url)
	require.ErrorIs(t, refused, advisory.ErrSessionPooling)
	var left []string
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		rows, err := env.AdminPool().Query(ctx, `SELECT format('key %s pid %s', (classid::bigint << 32) | objid::bigint, pid)
			FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = $1)`, d.Name)
		if err != nil {
			return false, err
		}
		left, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return len(left) == 0, err
	}, "advisory locks left on backends behind PgBouncer after ErrSessionPooling and Close: %v", &left)
}
