package leasetable_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// TestWaitLeavesTheQueueBeforeItsDeadline: a wait whose context has a
// deadline leaves the queue itself just before it, on the caller's
// goroutine and connection, and sends no look that could not come back in
// time. It used to leave after the deadline, in the background, beside the
// caller's next call, and its look in flight at the deadline was
// abandoned: in a fleet of 500 clients (pools of 2, waits given up after
// 5s) the caller's next statement then found the pool's one connection
// busy with that look 248 times, and with the removal 80 more, and the
// pools grew to two connections each. So the waiter's registration is
// gone when the call returns: nobody finds it ahead of them after that.
func TestWaitLeavesTheQueueBeforeItsDeadline(t *testing.T) {
	// A margin that load cannot eat: a removal that took longer than it
	// would be left to the background, and the check below would see it.
	leasetable.SetLeaveMargin(t, time.Second)
	for _, tc := range []struct {
		name string
		cfg  leasetable.Config
		slow bool // looks wait for a row lock, 200 ms at a time
	}{
		{"listening", leasetable.Config{Owner: "w"}, false},
		{"polling, slow looks", leasetable.Config{Owner: "w", NoListen: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := pgtest.Context(t, time.Minute)
			pool := env.DB(t).Pool(t)
			holder := newClient(t, pool, leasetable.Config{Owner: "h", TTL: time.Minute})
			_, err := holder.Acquire(ctx, "n")
			require.NoError(t, err)
			c := newClient(t, pool, tc.cfg)
			if tc.slow {
				stop := make(chan struct{})
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						tx, err := pool.Begin(ctx)
						if err != nil {
							return
						}
						_, err = tx.Exec(ctx, "SELECT FROM pgbaton.lease WHERE name = 'n' FOR UPDATE")
						if err == nil {
							_, err = tx.Exec(ctx, "SELECT pg_sleep(0.2)")
						}
						_ = tx.Rollback(ctx)
						if err != nil {
							return
						}
					}
				}()
				defer wg.Wait()
				defer close(stop)
			}
			wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			deadline, _ := wctx.Deadline()
			_, err = c.Acquire(wctx, "n")
			require.ErrorIs(t, err, context.DeadlineExceeded)
			assert.False(t, time.Now().Before(deadline), "returned before its deadline")
			// At once: nothing is left to remove it after the call returned.
			assert.Equal(t, 0, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_waiter WHERE name = 'n'"),
				"the waiter's registration outlived the call")
		})
	}
}
