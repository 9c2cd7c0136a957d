package leasetable_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// waitAfterRelease has b wait for a lease a holds, releases it once b
// waits, and returns how long b's Acquire took after the release.
func waitAfterRelease(t *testing.T, a, b *leasetable.Client, waiting <-chan string, name string) time.Duration {
	t.Helper()
	ctx := pgtest.Context(t, time.Minute)
	la, err := a.TryAcquire(ctx, name)
	require.NoError(t, err)
	got := make(chan error, 1)
	var released time.Time
	go func() {
		lb, err := b.Acquire(ctx, name)
		if err == nil {
			err = lb.Release(ctx)
		}
		got <- err
	}()
	require.Equal(t, name, <-waiting)
	released = time.Now()
	require.NoError(t, la.Release(ctx))
	require.NoError(t, <-got)
	return time.Since(released)
}

// Behind a transaction pooler LISTEN succeeds but delivers nothing: the
// client notices, its waiters poll instead of sleeping to the holder's
// expiry, and Check reports the degraded mode instead of failing. With
// ListenDSN pointing at the server, waiters wake at once again.
func TestLeasesBehindTransactionPooler(t *testing.T) {
	d := env.DB(t)
	bouncer := pgtest.StartPgBouncer(t, d)
	pool := pgtest.Pool(t, bouncer, func(c *pgxpool.Config) {
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	})
	ctx := pgtest.Context(t, time.Minute)
	const ttl = 15 * time.Second
	t.Run("polling fallback", func(t *testing.T) {
		waiting := make(chan string, 1)
		a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: ttl})
		b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: ttl, PollInterval: 200 * time.Millisecond, Logger: logTo(waiting)})
		took := waitAfterRelease(t, a, b, waiting, "pooled")
		t.Logf("behind PgBouncer (transaction mode), TTL %s: granted %s after the release", ttl, took.Round(time.Millisecond))
		assert.Less(t, took, 5*time.Second, "the waiter slept towards the holder's expiry (%s)", ttl)
		// The waiter polled from listener.ReadyWait on; the client finds out
		// that nothing is delivered when its probe times out.
		var err error
		pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
			err = b.Check(ctx)
			return errors.Is(err, pgbaton.ErrDegraded), nil
		}, "Check does not report the degraded mode")
		assert.Contains(t, err.Error(), "ListenDSN")
	})
	t.Run("ListenDSN", func(t *testing.T) {
		waiting := make(chan string, 1)
		a := newClient(t, pool, leasetable.Config{Owner: "a2", TTL: ttl})
		b := newClient(t, pool, leasetable.Config{Owner: "b2", TTL: ttl, ListenDSN: d.URL, PollInterval: 10 * time.Second, Logger: logTo(waiting)})
		took := waitAfterRelease(t, a, b, waiting, "direct")
		t.Logf("behind PgBouncer with a direct ListenDSN: granted %s after the release", took.Round(time.Millisecond))
		assert.Less(t, took, 5*time.Second, "not woken by the notification (PollInterval 10s)")
		require.NoError(t, b.Check(ctx))
		var app string
		require.NoError(t, d.Pool(t).QueryRow(ctx,
			"SELECT application_name FROM pg_stat_activity WHERE application_name LIKE 'pgbaton lease listener %b2'").Scan(&app))
		assert.Equal(t, "pgbaton lease listener b2", app)
	})
}

// With NoListen a client holds no connection for notifications: waiters
// look again at most every PollInterval.
func TestNoListenPolls(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	waiting := make(chan string, 1)
	a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: 30 * time.Second})
	b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: 30 * time.Second, NoListen: true, PollInterval: 100 * time.Millisecond, Logger: logTo(waiting)})
	took := waitAfterRelease(t, a, b, waiting, "polled")
	assert.Less(t, took, 5*time.Second, "the waiter did not poll (TTL 30s)")
	require.NoError(t, b.Check(ctx), "polling by choice is not degraded")
	var listeners int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgbaton lease listener%'").Scan(&listeners))
	assert.Zero(t, listeners, "no LISTEN connection")
	var waiters int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease_waiter WHERE waiter LIKE 'b/%'").Scan(&waiters))
	assert.Zero(t, waiters, "a polling waiter registers nothing")
	_, err := leasetable.New(ctx, pool, leasetable.Config{NoListen: true, ListenDSN: d.URL})
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	_, err = leasetable.New(ctx, pool, leasetable.Config{PollInterval: -time.Second})
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	_, err = leasetable.New(ctx, pool, leasetable.Config{ListenDSN: "postgres://%zz"})
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
}
