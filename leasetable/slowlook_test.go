package leasetable_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
			waited := map[int32]bool{}
			pgtest.Eventually(t, time.Minute, func() (bool, error) {
				select {
				case r := <-res:
					return false, fmt.Errorf("Acquire ended while the row was locked: %v, %v", r.l, r.err)
				default:
				}
				rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity
					WHERE wait_event_type = 'Lock' AND query LIKE '%lease_attempt%' AND pid <> pg_backend_pid()`)
				if err != nil {
					return false, err
				}
				pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
				for _, p := range pids {
					waited[p] = true
				}
				return len(waited) >= 2, err
			}, "no second look after the first was cut at the TTL")
			require.NoError(t, tx.Rollback(ctx))

			var r acquired
			select {
			case r = <-res:
			case <-time.After(time.Minute):
				t.Fatal("Acquire did not return within a minute of the row lock's end")
			}
			require.NoError(t, r.err)
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
