package leasetable_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// A release reports its waiters instead of notifying them in its own
// transaction: a NOTIFY holds the server's database-wide notify lock
// through its transaction's commit flush, which serialised every release
// that had waiters. The notification comes from notify_waiters, sent after
// the release committed. A sentinel notified after the release's commit
// arrives first, so the release's transaction sent none.
func TestReleaseReportsWaitersAndDoesNotNotify(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	listen := listenConn(t, ctx, pool)

	var token int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire('n', 'o', 60000)").Scan(&token))
	_, err := pool.Exec(ctx, "SELECT pgbaton.wait_for('n', 'someone/1')")
	require.NoError(t, err)

	var released, waiters bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT released, waiters FROM pgbaton.release('n', 'o', $1)", token).Scan(&released, &waiters))
	require.True(t, released)
	require.True(t, waiters, "the release did not report its waiter")
	_, err = pool.Exec(ctx, "NOTIFY pgbaton_lease, 'sentinel'")
	require.NoError(t, err)
	n, err := listen.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, "sentinel", n.Payload, "the release's own transaction notified")

	_, err = pool.Exec(ctx, "SELECT pgbaton.notify_waiters('{n}')")
	require.NoError(t, err)
	n, err = listen.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, "someone/1", n.Payload, "the queue's head is woken by its id")

	// Nobody waits: nothing to report; a superseded grant releases nothing.
	_, err = pool.Exec(ctx, "SELECT pgbaton.stop_waiting('n', 'someone/1')")
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire('n', 'o', 60000)").Scan(&token))
	require.NoError(t, pool.QueryRow(ctx, "SELECT released, waiters FROM pgbaton.release('n', 'o', $1)", token).Scan(&released, &waiters))
	assert.True(t, released)
	assert.False(t, waiters)
	require.NoError(t, pool.QueryRow(ctx, "SELECT released, waiters FROM pgbaton.release('n', 'o', $1)", token).Scan(&released, &waiters))
	assert.False(t, released)
	assert.False(t, waiters)
}

// release_many reports, per name freed, whether anyone waits for it or
// for its group; notify_waiters wakes a group's waiters when given a
// lease of the group.
func TestReleaseManyReportsWaitersByNameAndGroup(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	listen := listenConn(t, ctx, pool)
	_, err := pool.Exec(ctx, "SELECT pgbaton.register('g', '{a,b}')")
	require.NoError(t, err)
	var names []string
	var tokens []int64
	rows, err := pool.Query(ctx, "SELECT name, token FROM pgbaton.claim('g', 'o', 2, 60000)")
	require.NoError(t, err)
	for rows.Next() {
		var n string
		var tok int64
		require.NoError(t, rows.Scan(&n, &tok))
		names, tokens = append(names, n), append(tokens, tok)
	}
	require.NoError(t, rows.Err())
	require.Len(t, names, 2)
	var token int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire('solo', 'o', 60000)").Scan(&token))
	names, tokens = append(names, "solo"), append(tokens, token)
	_, err = pool.Exec(ctx, "SELECT pgbaton.wait_for('g', 'someone/1', true)")
	require.NoError(t, err)

	got := map[string]bool{}
	rows, err = pool.Query(ctx, "SELECT name, waiters FROM pgbaton.release_many($1, $2, 'o')", names, tokens)
	require.NoError(t, err)
	for rows.Next() {
		var n string
		var w bool
		require.NoError(t, rows.Scan(&n, &w))
		got[n] = w
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]bool{"a": true, "b": true, "solo": false}, got)

	_, err = pool.Exec(ctx, "SELECT pgbaton.notify_waiters('{a,b}')")
	require.NoError(t, err)
	n, err := listen.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, "someone/1", n.Payload, "a group's waiters are woken by a lease of the group, by their ids")
}

// The client sends the release and the wake-up as two statements, the
// wake-up only when the release reported waiters, and the waiter is woken
// by it (not by the holder's expiry, a minute away).
func TestClientWakesWaitersAfterTheRelease(t *testing.T) {
	d := env.DB(t)
	sent := &statementCounter{}
	pool := d.Pool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = sent })
	ctx := pgtest.Context(t, time.Minute)
	holder := newClient(t, pool, leasetable.Config{Owner: "holder", TTL: time.Minute})
	waiter := newClient(t, d.Pool(t), leasetable.Config{Owner: "waiter", TTL: time.Minute})

	// No waiter: no wake-up is sent.
	l, err := holder.TryAcquire(ctx, "n")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	assert.Zero(t, countContaining(sent.snapshot(), "notify_waiters"), "a wake-up was sent with nobody waiting")

	l, err = holder.TryAcquire(ctx, "n")
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		w, err := waiter.Acquire(ctx, "n")
		if err == nil {
			err = w.Release(ctx)
		}
		got <- err
	}()
	queued(t, ctx, pool, "n", 1)
	released := time.Now()
	require.NoError(t, l.Release(ctx))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not woken by the release")
	}
	t.Logf("waiter woken %s after the release", time.Since(released))
	stmts := sent.snapshot()
	rel, wake := -1, -1
	for i, s := range stmts {
		if strings.Contains(s, "pgbaton.release(") {
			rel = i
		}
		if strings.Contains(s, "pgbaton.notify_waiters(") {
			wake = i
		}
	}
	require.NotEqual(t, -1, wake, "no wake-up was sent")
	assert.Less(t, rel, wake, "the wake-up was not sent after the release")
	assert.NotContains(t, stmts[rel], "notify_waiters")
}

func countContaining(stmts []string, s string) (n int) {
	for _, x := range stmts {
		if strings.Contains(x, s) {
			n++
		}
	}
	return n
}

// Registers into a group nobody waits for do not wait for each other: the
// wake-up's queue lock is taken only when the group has waiters. It used
// to be taken by every Register and held to its commit, so the Registers
// of a fleet into one shared group committed one at a time (500 clients on
// 2 cores: 0.9-1.2 s per Register). With a waiter they still take turns,
// which TestLeavingWaiterHandsOnAReleaseInFlight needs.
func TestRegistersWithoutWaitersDoNotWaitForEachOther(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	first, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer first.Rollback(ctx) //nolint:errcheck
	_, err = first.Exec(ctx, "SELECT pgbaton.register('shared', '{a}')")
	require.NoError(t, err)

	second, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer second.Rollback(ctx) //nolint:errcheck
	// Long enough for any scheduler; a Register that waits for the first
	// one's commit fails with lock_not_available.
	_, err = second.Exec(ctx, "SET LOCAL lock_timeout = '10s'")
	require.NoError(t, err)
	_, err = second.Exec(ctx, "SELECT pgbaton.register('shared', '{b}')")
	require.NoError(t, err, "the second Register waited for the first one's commit")
	require.NoError(t, second.Commit(ctx))
	require.NoError(t, first.Commit(ctx))
	assert.Equal(t, 2, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE lease_group = 'shared'"))
}
