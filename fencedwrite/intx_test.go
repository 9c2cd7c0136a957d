package fencedwrite_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/faultproxy"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

func rowCount(t *testing.T, ctx context.Context, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n))
	return n
}

func TestInTxCommitsUnderAValidLease(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	lease := fencedwrite.Token("job:a", acquire(t, ctx, pool, "job:a", "me", time.Minute))

	require.NoError(t, fencedwrite.InTx(ctx, pool, lease, func(tx pgx.Tx) error {
		var iso string
		if err := tx.QueryRow(ctx, "SHOW transaction_isolation").Scan(&iso); err != nil {
			return err
		}
		if iso != "read committed" {
			return errors.New("isolation is " + iso)
		}
		_, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)")
		return err
	}))
	require.Equal(t, 1, rowCount(t, ctx, pool))
}

func TestInTxRejectsAStaleLeaseAndWritesNothing(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	old := acquire(t, ctx, pool, "job:a", "old", 20*time.Millisecond)
	waitExpired(t, ctx, pool, "job:a")
	current := acquire(t, ctx, pool, "job:a", "new", time.Minute)

	called := false
	err = fencedwrite.InTx(ctx, pool, fencedwrite.Token("job:a", old), func(tx pgx.Tx) error {
		called = true
		return nil
	})
	requireStale(t, err, "job:a", old, current, "superseded")
	require.False(t, called, "fn does not run under a stale token")
	require.Zero(t, rowCount(t, ctx, pool))
	requireUnlocked(t, ctx, pool, "job:a")
}

func TestInTxReturnsFnErrorAndRollsBack(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY, fence_token bigint)")
	require.NoError(t, err)
	lease := fencedwrite.Token("job:a", acquire(t, ctx, pool, "job:a", "me", time.Minute))

	boom := errors.New("boom")
	err = fencedwrite.InTx(ctx, pool, lease, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
			return err
		}
		return boom
	})
	require.Same(t, boom, err, "fn's error comes back as it is")
	require.Zero(t, rowCount(t, ctx, pool))
	requireUnlocked(t, ctx, pool, "job:a")

	// A fenced row newer than the lease's token: the trigger's error from
	// inside fn is a *StaleTokenError.
	require.NoError(t, fencedwrite.EnableFencing(ctx, pool, pgx.Identifier{"t"}))
	_, err = pool.Exec(ctx, "INSERT INTO t VALUES (2, $1)", lease.Token()+1000)
	require.NoError(t, err)
	err = fencedwrite.InTx(ctx, pool, lease, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "UPDATE t SET fence_token = $1 WHERE id = 2", lease.Token())
		return err
	})
	requireStale(t, err, "public.t", lease.Token(), lease.Token()+1000, "older than the row's")
}

// fn swallows a statement's error and returns nil: the transaction is
// aborted and COMMIT turns into ROLLBACK. InTx says nothing was written
// rather than returning pgx's bare error, and reports a stale token if
// that is what the lease says now.
func TestInTxReportsARolledBackCommit(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	lease := fencedwrite.Token("job:a", acquire(t, ctx, pool, "job:a", "me", time.Minute))

	err = fencedwrite.InTx(ctx, pool, lease, func(tx pgx.Tx) error {
		_, _ = tx.Exec(ctx, "INSERT INTO t VALUES (1)")
		_, _ = tx.Exec(ctx, "INSERT INTO t VALUES (1)") // duplicate key, ignored
		return nil
	})
	require.ErrorIs(t, err, pgx.ErrTxCommitRollback)
	require.NotErrorIs(t, err, fencedwrite.ErrStaleToken)
	require.Contains(t, err.Error(), "nothing was written")
	require.Zero(t, rowCount(t, ctx, pool))
	requireUnlocked(t, ctx, pool, "job:a")
}

// The guarded transaction's backend is killed while fn runs; the lease then
// expires and is taken over. COMMIT fails on the dead connection, and InTx
// reports the stale token, not a bare driver error.
func TestInTxCommitFailsAfterTheLeaseMoved(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	old := acquire(t, ctx, pool, "job:a", "old", 200*time.Millisecond)

	var current int64
	err = fencedwrite.InTx(ctx, pool, fencedwrite.Token("job:a", old), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
			return err
		}
		env.Terminate(t, tx.Conn().PgConn().PID())
		waitExpired(t, ctx, pool, "job:a")
		current = acquire(t, ctx, pool, "job:a", "new", time.Minute)
		return nil
	})
	t.Log(err)
	requireStale(t, err, "job:a", old, current, "superseded")
	var stale *fencedwrite.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.Error(t, stale.Err, "the commit's own error is kept underneath")
	require.Zero(t, rowCount(t, ctx, pool))
	requireUnlocked(t, ctx, pool, "job:a")
}

// The same kill, but the lease stays with the holder: the commit error says
// nothing was written and is not a stale token.
func TestInTxCommitFailsWithTheLeaseStillHeld(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	lease := fencedwrite.Token("job:a", acquire(t, ctx, pool, "job:a", "me", time.Minute))

	err = fencedwrite.InTx(ctx, pool, lease, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
			return err
		}
		env.Terminate(t, tx.Conn().PgConn().PID())
		return nil
	})
	t.Log(err)
	require.Error(t, err)
	require.NotErrorIs(t, err, fencedwrite.ErrStaleToken)
	require.NotErrorIs(t, err, fencedwrite.ErrCommitUnknown)
	require.Contains(t, err.Error(), "nothing was written")
	require.Zero(t, rowCount(t, ctx, pool))
	// And the lease is still usable.
	require.NoError(t, fencedwrite.InTx(ctx, pool, lease, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)")
		return err
	}))
}

func TestInTxBadInput(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	fn := func(pgx.Tx) error { return nil }
	lease := fencedwrite.Token("job:a", 1)
	var nilPool *pgxpool.Pool
	require.ErrorIs(t, fencedwrite.InTx(ctx, nil, lease, fn), pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, fencedwrite.InTx(ctx, nilPool, lease, fn), pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, fencedwrite.InTx(ctx, pool, nil, fn), pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, fencedwrite.InTx(ctx, pool, lease, nil), pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, fencedwrite.InTx(ctx, pool, fencedwrite.Token("", 1), fn), pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, fencedwrite.InTx(ctx, pool, fencedwrite.Token("job:a", 0), fn), pgbaton.ErrInvalidArgument)

	// An unknown lease is not bad input but a stale token: nobody holds it.
	requireStale(t, fencedwrite.InTx(ctx, pool, lease, fn), "job:a", 1, 0, "no such lease")
	require.Zero(t, pool.Stat().AcquiredConns(), "no connection left checked out")
}

// COMMIT reaches the server and commits, but the reply is lost: the
// connection is cut while the reply is on its way. InTx asks the database
// (txid_status) and reports the truth: committed, so nil.
func TestInTxCommitReplyLost(t *testing.T) {
	ctx := testContext(t)
	db := env.DB(t)
	direct := db.Pool(t)
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	if strings.HasPrefix(cfg.Host, "/") {
		t.Skip("the test server is on a unix socket; the fault proxy needs TCP")
	}
	proxy, err := faultproxy.New(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	proxied := pgtest.Pool(t, db.URL, func(c *pgxpool.Config) {
		c.ConnConfig.Host = "127.0.0.1"
		c.ConnConfig.Port = uint16(proxy.Port())
	})
	_, err = direct.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	lease := fencedwrite.Token("job:a", acquire(t, ctx, direct, "job:a", "me", time.Minute))

	done := make(chan error, 1)
	go func() {
		done <- fencedwrite.InTx(ctx, proxied, lease, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)")
			// From here every chunk each way waits: the COMMIT reaches
			// the server late, and its reply later still.
			proxy.SetLatency(time.Second)
			return err
		})
	}()
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		return rowCount(t, ctx, direct) == 1, nil
	}, "the transaction did not commit")
	proxy.Cut() // the reply is still held back: it is lost
	proxy.SetLatency(0)
	select {
	case err := <-done:
		require.NoError(t, err, "committed, though the reply was lost")
	case <-time.After(30 * time.Second):
		t.Fatal("InTx did not return")
	}
}

func TestInTxRollsBackOnPanic(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	lease := fencedwrite.Token("job:a", acquire(t, ctx, pool, "job:a", "me", time.Minute))
	require.PanicsWithValue(t, "boom", func() {
		_ = fencedwrite.InTx(ctx, pool, lease, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
				return err
			}
			panic("boom")
		})
	})
	require.Zero(t, rowCount(t, ctx, pool))
	requireUnlocked(t, ctx, pool, "job:a")
}
