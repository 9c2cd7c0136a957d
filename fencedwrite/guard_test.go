package fencedwrite_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

func requireStale(t *testing.T, err error, name string, presented, current int64, reason fencedwrite.Reason) {
	t.Helper()
	require.ErrorIs(t, err, fencedwrite.ErrStaleToken)
	var stale *fencedwrite.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, name, stale.Name)
	require.Equal(t, presented, stale.Presented)
	require.Equal(t, current, stale.Current)
	require.Equal(t, reason, stale.Reason)
}

func TestGuardAcceptsTheHolder(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	token := acquire(t, ctx, pool, "job:a", "me", time.Minute)
	_, err := pool.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY, v int)")
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, fencedwrite.Guard(ctx, tx, "job:a", token))
	require.NoError(t, fencedwrite.GuardLease(ctx, tx, fencedwrite.Token("job:a", token)), "twice in one transaction")
	_, err = tx.Exec(ctx, "INSERT INTO t VALUES (1, 1)")
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
}

func TestGuardRejectsStaleTokens(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	first := acquire(t, ctx, pool, "job:a", "a", 50*time.Millisecond)
	waitExpired(t, ctx, pool, "job:a")
	guard := func(name string, token int64) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fencedwrite.Guard(ctx, tx, name, token) })
	}
	requireStale(t, guard("job:a", first), "job:a", first, first, "expired")

	second := acquire(t, ctx, pool, "job:a", "b", time.Minute)
	require.Greater(t, second, first)
	requireStale(t, guard("job:a", first), "job:a", first, second, "superseded")
	requireStale(t, guard("job:a", second+100), "job:a", second+100, second, "not granted")
	requireStale(t, guard("job:nobody-took", 5), "job:nobody-took", 5, 0, "no such lease")

	var released bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT released FROM pgbaton.release('job:a', 'b', $1)", second).Scan(&released))
	require.True(t, released)
	requireStale(t, guard("job:a", second), "job:a", second, second, "released")

	// The error says what happened in plain words, and keeps the database
	// error underneath.
	err := guard("job:a", first)
	require.Contains(t, err.Error(), `stale fencing token for "job:a"`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, fencedwrite.SQLStateStaleToken, pgErr.Code)
	require.ErrorIs(t, fmtWrap(err), fencedwrite.ErrStaleToken, "errors.Is through wrapping")
}

// A write under the token of a work item that was completed meanwhile (its
// lease row is gone) says so, not "current token 0, unknown lease".
func TestCompletedItemSaysNoSuchLease(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	token := acquire(t, ctx, pool, "item:1", "me", time.Minute)
	var done bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT pgbaton.complete('item:1', 'me', $1)", token).Scan(&done))
	require.True(t, done)

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fencedwrite.Guard(ctx, tx, "item:1", token) })
	requireStale(t, err, "item:1", token, 0, "no such lease")
	require.EqualError(t, err, fmt.Sprintf(`fencedwrite: stale fencing token for "item:1": presented %d, no such lease (completed, or never granted)`, token))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Contains(t, pgErr.Message, "no such lease (completed, or never granted)", "psql users read the same")
	require.NotContains(t, pgErr.Message, "current 0")
}

func fmtWrap(err error) error { return errors.Join(errors.New("context"), err) }

// A failed guard aborts the transaction: a caller that ignores the error
// still cannot commit anything written under the stale token.
func TestFailedGuardAbortsTheTransaction(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO t VALUES (1)")
	require.NoError(t, err)
	require.ErrorIs(t, fencedwrite.Guard(ctx, tx, "job:unknown", 1), fencedwrite.ErrStaleToken)
	_, err = tx.Exec(ctx, "INSERT INTO t VALUES (2)")
	require.Error(t, err, "the transaction is aborted")
	require.ErrorIs(t, tx.Commit(ctx), pgx.ErrTxCommitRollback)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n))
	require.Zero(t, n)
}

// The core promise: while a guarded transaction is open, a takeover of its
// lease waits for it; the takeover then gets a larger token, and the old
// token can no longer write anything.
func TestTakeoverWaitsForGuardedTransaction(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	require.NoError(t, err)
	old := acquire(t, ctx, pool, "job:a", "old", 300*time.Millisecond)

	guarded, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer guarded.Rollback(ctx)
	require.NoError(t, fencedwrite.Guard(ctx, guarded, "job:a", old))
	_, err = guarded.Exec(ctx, "INSERT INTO t VALUES (1, 'old holder')")
	require.NoError(t, err)

	// A transaction of the old holder that has not checked yet.
	late, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer late.Rollback(ctx)
	_, err = late.Exec(ctx, "INSERT INTO t VALUES (2, 'late write')")
	require.NoError(t, err)

	// The lease expires while the guarded transaction is still open.
	waitExpired(t, ctx, pool, "job:a")

	// A release by the old holder (a plain UPDATE, which locks FOR NO KEY
	// UPDATE) waits: FOR KEY SHARE would have let it through.
	releasePID, released := async(t, ctx, pool, func(c *pgx.Conn) (bool, error) {
		var ok bool
		err := c.QueryRow(ctx, "SELECT released FROM pgbaton.release('job:a', 'old', $1)", old).Scan(&ok)
		return ok, err
	})
	waitBlocked(t, ctx, pool, releasePID)

	takePID, taken := async(t, ctx, pool, func(c *pgx.Conn) (int64, error) {
		var token int64
		err := c.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire('job:a', 'new', 60000)").Scan(&token)
		return token, err
	})
	waitBlocked(t, ctx, pool, takePID)

	require.NoError(t, guarded.Commit(ctx))
	newToken, err := receive(t, taken)
	require.NoError(t, err)
	require.Greater(t, newToken, old, "the takeover gets a larger token")
	_, err = receive(t, released)
	require.NoError(t, err)

	// The old token can no longer commit anything.
	err = fencedwrite.Guard(ctx, late, "job:a", old)
	requireStale(t, err, "job:a", old, newToken, "superseded")
	require.ErrorIs(t, late.Commit(ctx), pgx.ErrTxCommitRollback)
	_, err = pool.Exec(ctx, "INSERT INTO t SELECT 3, 'inline' WHERE pgbaton.assert_token('job:a', $1)", old)
	requireStale(t, fencedwrite.MapError(err), "job:a", old, newToken, "superseded")

	rows, err := pool.Query(ctx, "SELECT v FROM t ORDER BY id")
	require.NoError(t, err)
	vs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"old holder"}, vs)
}

// A transaction that guards a lease while the lease's takeover is in
// progress waits for the takeover and then sees the new token.
func TestGuardWaitsForTakeoverInProgress(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	old := acquire(t, ctx, pool, "job:a", "old", time.Minute)

	// Hold the lease row like a grant in progress does.
	taker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer taker.Rollback(ctx)
	var newToken int64
	require.NoError(t, taker.QueryRow(ctx,
		`UPDATE pgbaton.lease SET owner = 'new', token = nextval('pgbaton.lease_token_seq')
		  WHERE name = 'job:a' RETURNING token`).Scan(&newToken))

	pid, guarded := async(t, ctx, pool, func(c *pgx.Conn) (struct{}, error) {
		return struct{}{}, pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error { return fencedwrite.Guard(ctx, tx, "job:a", old) })
	})
	waitBlocked(t, ctx, pool, pid)
	require.NoError(t, taker.Commit(ctx))
	_, err = receive(t, guarded)
	requireStale(t, err, "job:a", old, newToken, "superseded")
}

func TestGuardBadInput(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)

	require.ErrorIs(t, fencedwrite.Guard(ctx, nil, "job:a", 1), pgbaton.ErrInvalidArgument)
	var nilTx pgx.Tx
	require.ErrorIs(t, fencedwrite.Guard(ctx, nilTx, "job:a", 1), pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, fencedwrite.Guard(ctx, tx, "", 1), pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, fencedwrite.Guard(ctx, tx, strings.Repeat("x", 256), 1), pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, fencedwrite.Guard(ctx, tx, "job:a", 0), pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, fencedwrite.Guard(ctx, tx, "job:a", -3), pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, fencedwrite.GuardLease(ctx, tx, nil), pgbaton.ErrInvalidArgument)
	var nilLease *struct{ fencedwrite.Lease }
	require.ErrorIs(t, fencedwrite.GuardLease(ctx, tx, nilLease), pgbaton.ErrInvalidArgument)

	// Bad input changed nothing: the transaction is still usable and no
	// lease row was made.
	var n int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease").Scan(&n))
	require.Zero(t, n)

	// The SQL function refuses the same input with 22023.
	for _, args := range [][]any{{"", 1}, {nil, 1}, {"job:a", 0}, {"job:a", nil}} {
		_, err := pool.Exec(ctx, "SELECT pgbaton.assert_token($1, $2)", args...)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "%v", args)
		require.Equal(t, "22023", pgErr.Code, "%v", args)
	}
}

func TestMapError(t *testing.T) {
	require.NoError(t, fencedwrite.MapError(nil))
	other := errors.New("other")
	require.Equal(t, other, fencedwrite.MapError(other))
	notOurs := &pgconn.PgError{Code: "23505"}
	require.Equal(t, error(notOurs), fencedwrite.MapError(notOurs))

	// A PB001 from any client, with a name that looks like the detail.
	pgErr := &pgconn.PgError{Code: "PB001", Detail: "presented=3 current=9 reason=older than the row's name=weird name=x reason=y"}
	err := fencedwrite.MapError(pgErr)
	requireStale(t, err, "weird name=x reason=y", 3, 9, "older than the row's")
	require.Same(t, err, fencedwrite.MapError(err), "mapping twice changes nothing")
}

func TestGuardHonoursContext(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	token := acquire(t, ctx, pool, "job:a", "me", time.Minute)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	err = fencedwrite.Guard(cancelled, tx, "job:a", token)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, fencedwrite.ErrStaleToken)
}

// REPEATABLE READ adds failures, not safety: a renewal committed after the
// transaction's snapshot makes the guard fail with a serialization error
// (40001), though the token is valid. With Guard as the first statement
// it passes.
func TestGuardUnderRepeatableRead(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	token := acquire(t, ctx, pool, "job:a", "me", time.Minute)
	rr := pgx.TxOptions{IsoLevel: pgx.RepeatableRead}

	tx, err := pool.BeginTx(ctx, rr)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SELECT 1") // takes the snapshot
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "SELECT * FROM pgbaton.renew('job:a', 'me', $1, 60000)", token)
	require.NoError(t, err)
	err = fencedwrite.Guard(ctx, tx, "job:a", token)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "40001", pgErr.Code)
	require.NotErrorIs(t, err, fencedwrite.ErrStaleToken)

	require.NoError(t, pgx.BeginTxFunc(ctx, pool, rr, func(tx pgx.Tx) error {
		return fencedwrite.Guard(ctx, tx, "job:a", token)
	}))
}

func TestGuardInReadOnlyTransaction(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	token := acquire(t, ctx, pool, "job:a", "me", time.Minute)
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return fencedwrite.Guard(ctx, tx, "job:a", token)
	})
	require.ErrorContains(t, err, "needs a read-write transaction")
	require.NotErrorIs(t, err, fencedwrite.ErrStaleToken)
	require.NotErrorIs(t, err, pgbaton.ErrStandby, "a read-only transaction on the primary is not a standby")
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		_, err := fencedwrite.PutValue(ctx, tx, "k", token, []byte(`1`))
		return err
	})
	require.ErrorContains(t, err, "read-only transaction")
	require.NotErrorIs(t, err, pgbaton.ErrStandby)
}

// A database without the pgbaton schema is reported as such, not as a
// stale token.
func TestNotMigrated(t *testing.T) {
	ctx := testContext(t)
	pool := env.EmptyDB(t).Pool(t)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fencedwrite.Guard(ctx, tx, "job:a", 1) })
	require.ErrorIs(t, err, pgbaton.ErrNotMigrated)
	require.NotErrorIs(t, err, fencedwrite.ErrStaleToken)
	require.ErrorIs(t, fencedwrite.InTx(ctx, pool, fencedwrite.Token("job:a", 1), func(pgx.Tx) error { return nil }), pgbaton.ErrNotMigrated)
	_, err = fencedwrite.PutValue(ctx, pool, "k", 1, []byte(`1`))
	require.ErrorIs(t, err, pgbaton.ErrNotMigrated)
	_, err = pool.Exec(ctx, "CREATE TABLE t (fence_token bigint)")
	require.NoError(t, err)
	require.ErrorIs(t, fencedwrite.EnableFencing(ctx, pool, pgx.Identifier{"t"}), pgbaton.ErrNotMigrated)
}

// Liveness cost of the guard, as the package documentation says: while a
// guarded transaction is open, the holder's own renewal waits for it.
func TestGuardedTransactionDelaysRenewal(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	client, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "me", TTL: time.Minute})
	require.NoError(t, err)
	defer client.Close(ctx)
	lease, err := client.TryAcquire(ctx, "job:a")
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	require.NoError(t, fencedwrite.GuardLease(ctx, tx, lease))

	renewed := make(chan error, 1)
	go func() { renewed <- lease.Renew(ctx) }()
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%renew%'`).Scan(&n)
		return n == 1, err
	}, "the renewal is not waiting for the guarded transaction")
	require.NoError(t, tx.Commit(ctx))
	select {
	case err := <-renewed:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("renewal still waiting after the guarded transaction ended")
	}
	require.NoError(t, lease.Release(ctx))
}
