package leasetable_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// TestWaitOutlastsALookCutAtItsTTL: a look that gets no reply within the
// TTL (a busy server, a row lock held by someone's transaction) is cut off
// by its own bound, not by the caller's context. Acquire failed there with
// "acquire NAME: timeout: context deadline exceeded" although the caller
// had passed context.Background (one CI run of the lock-protected counter
// on a loaded machine, TTL 300 ms): a wait ends by its context only. The
// cut statement may still have committed a grant (pgx's cancel request
// can land after the commit), bound to the client's session, which would
// keep it alive with no Lease to give it back: such a grant is given back
// by its request id, like one whose reply was lost, and the client ends up
// holding the name once.
func TestWaitOutlastsALookCutAtItsTTL(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func(t *testing.T) context.Context
	}{
		// A context that never ends runs the statement on the caller's
		// goroutine; one that can end, on a goroutine of its own.
		{"background", func(*testing.T) context.Context { return context.Background() }},
		{"deadline", func(t *testing.T) context.Context { return pgtest.Context(t, 2*time.Minute) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := pgtest.Context(t, 2*time.Minute)
			pool := env.DB(t).Pool(t)
			const ttl = 300 * time.Millisecond
			c := newClient(t, pool, leasetable.Config{Owner: "w", TTL: ttl})
			other := newClient(t, pool, leasetable.Config{Owner: "o", TTL: time.Minute})
			l, err := other.Acquire(ctx, "n")
			require.NoError(t, err)
			require.NoError(t, l.Release(ctx))

			// Someone's transaction holds the lease row: every grant of "n"
			// waits for it.
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(context.Background())
			_, err = tx.Exec(ctx, "SELECT FROM pgbaton.lease WHERE name = 'n' FOR UPDATE")
			require.NoError(t, err)

			wctx := tc.ctx(t)
			res := goAcquire(func() (*leasetable.Lease, error) { return c.Acquire(wctx, "n") })
			// Two backends have waited for the row lock with a lease_attempt:
			// the first look was cut at the TTL and the wait looked again.
			r := afterSecondTry(t, ctx, pool, tx, res, "lease_attempt", "the row was locked")
			// Whatever the cut looks granted was given back: the client holds
			// "n" once, under the token of the Lease it returned.
			var token int64
			pgtest.Eventually(t, time.Minute, func() (bool, error) {
				var n int
				err := pool.QueryRow(ctx, "SELECT count(*), max(token) FROM pgbaton.lease_status WHERE held AND owner = 'w'").Scan(&n, &token)
				return n == 1 && token == r.l.Token(), err
			}, "the client holds more than its Lease, or another token (%d, Lease %d)", &token, r.l.Token())
			require.NoError(t, r.l.Release(ctx))
			var held int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease_status WHERE held").Scan(&held))
			require.Zero(t, held)
		})
	}
}

// TestWaitOutlastsASessionOpenCutAtItsTTL: a wait that needs a new lease
// session (its first look, or its session ended while it waited) and gets
// no reply to the opening within the TTL looks again, as after a look cut
// at the TTL. Acquire returned "open lease session: timeout: context
// deadline exceeded" there (one fresh-clone CI run of
// TestWaitOutlastsALookCutAtItsTTL on a loaded machine, TTL 300 ms): a
// wait ends by its context only.
func TestWaitOutlastsASessionOpenCutAtItsTTL(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	pool := env.DB(t).Pool(t)
	const ttl = 300 * time.Millisecond
	c := newClient(t, pool, leasetable.Config{Owner: "w", TTL: ttl})

	// Someone's transaction keeps every lease session from being opened.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.Background())
	_, err = tx.Exec(ctx, "LOCK TABLE pgbaton.lease_session IN SHARE MODE")
	require.NoError(t, err)

	res := goAcquire(func() (*leasetable.Lease, error) { return c.Acquire(context.Background(), "n") })
	// Two backends have waited for the table lock with a session_open: the
	// first opening was cut at the TTL and the wait tried again.
	r := afterSecondTry(t, ctx, pool, tx, res, "session_open", "no session could be opened")
	require.NoError(t, r.l.Release(ctx))
}

// afterSecondTry waits until two backends have waited for a lock held by
// tx while running fn (a SQL function's name) for the Acquire whose
// result comes on res: its first statement was cut at the TTL and it
// tried again. Then it ends tx and returns that Acquire's result, which
// must be a Lease. It fails the test if the Acquire ends first (while
// what was so).
func afterSecondTry(t *testing.T, ctx context.Context, pool *pgxpool.Pool, tx pgx.Tx, res <-chan acquired, fn, what string) acquired {
	t.Helper()
	waited := map[int32]bool{}
	pgtest.Eventually(t, time.Minute, func() (bool, error) {
		select {
		case r := <-res:
			return false, fmt.Errorf("Acquire ended while %s: %v, %v", what, r.l, r.err)
		default:
		}
		rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid()`, fn)
		if err != nil {
			return false, err
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		for _, p := range pids {
			waited[p] = true
		}
		return len(waited) >= 2, err
	}, "no second %s after the first was cut at the TTL", fn)
	require.NoError(t, tx.Rollback(ctx))
	select {
	case r := <-res:
		require.NoError(t, r.err)
		return r
	case <-time.After(time.Minute):
		t.Fatalf("Acquire did not return within a minute of the end of the lock (%s)", what)
		return acquired{}
	}
}
