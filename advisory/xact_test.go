package advisory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// recordedNames lists the names in pgbaton.advisory_name, as committed.
func recordedNames(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT name FROM pgbaton.advisory_name ORDER BY name")
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// begin starts a transaction that is rolled back when t ends, if it is
// still open, so that a failing test does not leave the pool waiting.
func begin(t *testing.T, pool *pgxpool.Pool, opts pgx.TxOptions) pgx.Tx {
	t.Helper()
	tx, err := pool.BeginTx(context.Background(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// A name is recorded in the caller's transaction, never on a second
// connection: with a pool of one connection, which the transaction holds,
// XactLock and XactTryLock still return at once.
func TestXactNameOnCallersTransaction(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	admin := d.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	// Short enough that a deadlock fails the test quickly, long enough for
	// a loaded machine.
	ctx, cancel := context.WithTimeout(pgtest.Context(t, time.Minute), 10*time.Second)
	defer cancel()

	tx := begin(t, pool, pgx.TxOptions{})
	require.NoError(t, l.XactLock(ctx, tx, advisory.Name("one-conn:wait")))
	require.NoError(t, l.XactTryLock(ctx, tx, advisory.Name("one-conn:try")))
	require.NoError(t, l.XactTryRLock(ctx, tx, advisory.Name("one-conn:shared")))
	require.Empty(t, recordedNames(t, admin), "recorded in the caller's transaction, not yet committed")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, []string{"one-conn:try", "one-conn:wait"}, recordedNames(t, admin), "shared locks do not record")

	// A rolled-back transaction records nothing, and the Locker does not
	// take the name for recorded: the next transaction records it.
	tx = begin(t, pool, pgx.TxOptions{})
	require.NoError(t, l.XactLock(ctx, tx, advisory.Name("one-conn:rolled-back")))
	require.NoError(t, tx.Rollback(ctx))
	require.NotContains(t, recordedNames(t, admin), "one-conn:rolled-back")
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return l.XactTryLock(ctx, tx, advisory.Name("one-conn:rolled-back"))
	}))
	require.Contains(t, recordedNames(t, admin), "one-conn:rolled-back")
}

// Behind PgBouncer in transaction mode, XactLock and XactTryLock with a
// Name key work, in every query mode PgBouncer 1.18 supports and with a
// pool of one connection: every statement runs in the caller's
// transaction, on its backend.
func TestXactNameBehindPgBouncer(t *testing.T) {
	if env.Cluster() == nil {
		t.Skip("needs the throwaway cluster's TCP port") // only with PGBATON_TEST_DSN
	}
	d := env.DB(t)
	url := pgtest.StartPgBouncer(t, d)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(pgtest.Context(t, time.Minute), 20*time.Second)
			defer cancel()
			bouncer := func(c *pgxpool.Config) {
				c.ConnConfig.DefaultQueryExecMode = mode
				c.MaxConns = 1
			}
			pool := pgtest.Pool(t, url, bouncer)
			other := pgtest.Pool(t, url, bouncer)
			l := newLocker(t, pool, advisory.Config{})
			for i := range 3 {
				key := advisory.Name(fmt.Sprintf("bouncer:%s:%d", mode, i))
				tx := begin(t, pool, pgx.TxOptions{})
				require.NoError(t, l.XactTryLock(ctx, tx, key))
				tx2 := begin(t, other, pgx.TxOptions{})
				require.ErrorIs(t, l.XactTryLock(ctx, tx2, key), advisory.ErrLocked)
				require.NoError(t, tx2.Rollback(ctx))
				require.NoError(t, tx.Commit(ctx))
				require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return l.XactLock(ctx, tx, key) }))
			}
		})
	}
}

// A name recorded by an open transaction makes no other locker wait for
// that transaction: a session TryLock or XactTryLock of the name says
// ErrLocked at once, and shared locks do not record, so two of them never
// wait for each other.
func TestXactRecordingBlocksNobody(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	other := newLocker(t, pool, advisory.Config{})
	ctx, cancel := context.WithTimeout(pgtest.Context(t, time.Minute), 10*time.Second)
	defer cancel()

	tx := begin(t, pool, pgx.TxOptions{})
	require.NoError(t, l.XactTryLock(ctx, tx, advisory.Name("fresh")))
	_, err := other.TryLock(ctx, advisory.Name("fresh"))
	require.ErrorIs(t, err, advisory.ErrLocked)
	tx2 := begin(t, pool, pgx.TxOptions{})
	require.ErrorIs(t, other.XactTryLock(ctx, tx2, advisory.Name("fresh")), advisory.ErrLocked)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, tx2.Rollback(ctx))

	tx = begin(t, pool, pgx.TxOptions{})
	require.NoError(t, l.XactTryRLock(ctx, tx, advisory.Name("fresh-shared")))
	tx2 = begin(t, pool, pgx.TxOptions{})
	require.NoError(t, other.XactTryRLock(ctx, tx2, advisory.Name("fresh-shared")))
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, tx2.Commit(ctx))
	require.Equal(t, []string{"fresh"}, recordedNames(t, pool), "shared locks leave recording to exclusive ones")
}

// A read-only transaction cannot record a name; the lock still works and
// the name is recorded by the next read-write use.
func TestXactNameReadOnlyTransaction(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	l := newLocker(t, pool, advisory.Config{})
	key := advisory.Name("read-only")

	tx := begin(t, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	require.NoError(t, l.XactLock(ctx, tx, key))
	other := newLocker(t, pool, advisory.Config{})
	tx2 := begin(t, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	require.ErrorIs(t, other.XactTryLock(ctx, tx2, key), advisory.ErrLocked)
	require.NoError(t, tx2.Rollback(ctx))
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the transaction is still usable")
	require.NoError(t, tx.Commit(ctx))
	require.Empty(t, recordedNames(t, pool))

	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return l.XactTryLock(ctx, tx, key) }))
	require.Equal(t, []string{"read-only"}, recordedNames(t, pool))
}

// A name that collides with another recorded name is refused before the
// lock is taken, and the caller's transaction stays usable.
func TestXactNameCollision(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	_, err := pool.Exec(ctx, "ALTER TABLE pgbaton.advisory_name DROP CONSTRAINT advisory_name_key_matches")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO pgbaton.advisory_name (key, name) VALUES (pgbaton.advisory_key('victim'), 'impostor')")
	require.NoError(t, err)
	l := newLocker(t, pool, advisory.Config{})
	tx := begin(t, pool, pgx.TxOptions{})
	for _, wait := range []bool{false, true} {
		if wait {
			err = l.XactLock(ctx, tx, advisory.Name("victim"))
		} else {
			err = l.XactTryLock(ctx, tx, advisory.Name("victim"))
		}
		require.ErrorIs(t, err, advisory.ErrKeyCollision)
		require.ErrorContains(t, err, "impostor")
	}
	granted, _ := advisoryLocks(t, adminPool(t), d)
	require.Zero(t, granted)
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the transaction is still usable")
}

// Without the schema a name cannot be recorded: ErrNotMigrated, and the
// transaction is aborted as by any failed statement. Numeric keys need no
// schema.
func TestXactNotMigrated(t *testing.T) {
	d := env.EmptyDB(t)
	pool := d.Pool(t)
	l := newLocker(t, pool, advisory.Config{})
	ctx := pgtest.Context(t, time.Minute)
	tx := begin(t, pool, pgx.TxOptions{})
	require.ErrorIs(t, l.XactTryLock(ctx, tx, advisory.Name("x")), pgbaton.ErrNotMigrated)
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return l.XactLock(ctx, tx, advisory.Int64(1)) }))
}

// standbyPool starts a streaming standby of the test cluster and returns a
// pool on a fresh test database there, once the standby accepts
// connections to it.
func standbyPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	if env.Cluster() == nil {
		t.Skip("needs the throwaway cluster") // only with PGBATON_TEST_DSN
	}
	d := env.DB(t)
	// The base backup begins with a checkpoint; one done now leaves it
	// almost nothing to write.
	_, err := env.AdminPool().Exec(pgtest.Context(t, time.Minute), "CHECKPOINT")
	require.NoError(t, err)
	standby := pgtest.NewStandby(t, env.Cluster())
	pool := pgtest.Pool(t, standby.URL(d.Name))
	ctx := pgtest.Context(t, time.Minute)
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		err := pool.Ping(ctx)
		return err == nil, nil
	}, "standby accepts connections to %s", d.Name)
	return pool
}

// On a standby every transaction-scoped lock is refused with ErrStandby,
// whatever the key, as session locks are: a standby's advisory locks
// exclude nobody on the primary. Nothing is locked there and the
// transaction stays usable.
func TestXactStandby(t *testing.T) {
	pool := standbyPool(t)
	ctx := pgtest.Context(t, time.Minute)
	l := newLocker(t, pool, advisory.Config{})

	type call func(context.Context, pgbaton.Tx, advisory.Key) error
	calls := map[string]call{
		"XactTryLock": l.XactTryLock, "XactLock": l.XactLock,
		"XactTryRLock": l.XactTryRLock, "XactRLock": l.XactRLock,
	}
	tx := begin(t, pool, pgx.TxOptions{})
	for name, fn := range calls {
		for _, key := range []advisory.Key{advisory.Int64(1), advisory.Pair(1, 2), advisory.Name("standby")} {
			require.ErrorIs(t, fn(ctx, tx, key), pgbaton.ErrStandby, "%s %s", name, key)
		}
	}
	var locks int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&locks),
		"the transaction is still usable")
	require.Zero(t, locks)
}

// BenchmarkXactTryLock: begin, XactTryLock and commit on one connection,
// versus raw pgx sending the same three statements. The key kinds show
// what the standby check and a recorded name cost.
func BenchmarkXactTryLock(b *testing.B) {
	d := env.DB(b)
	ctx := context.Background()
	l := newLocker(b, d.Pool(b), advisory.Config{})
	conn := rawConn(b, d)
	run := func(b *testing.B, lock func(pgx.Tx) error) {
		for b.Loop() {
			tx, err := conn.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := lock(tx); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("raw", func(b *testing.B) {
		run(b, func(tx pgx.Tx) error {
			var ok bool
			return tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", int64(1)).Scan(&ok)
		})
	})
	for _, key := range []advisory.Key{advisory.Int64(1), advisory.Name("bench")} {
		b.Run(key.String(), func(b *testing.B) {
			run(b, func(tx pgx.Tx) error { return l.XactTryLock(ctx, tx, key) })
		})
	}
}
