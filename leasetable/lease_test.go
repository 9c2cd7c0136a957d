package leasetable_test

import (
	"context"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

func TestTryAcquireHeldAndRelease(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	a := newClient(t, pool, leasetable.Config{Owner: "a"})
	b := newClient(t, pool, leasetable.Config{Owner: "b"})
	ctx := pgtest.Context(t, 30*time.Second)

	la, err := a.TryAcquire(ctx, "job")
	require.NoError(t, err)
	assert.Equal(t, "job", la.Name())
	assert.Positive(t, la.Token())
	assert.NoError(t, la.Err())

	_, err = b.TryAcquire(ctx, "job")
	require.ErrorIs(t, err, leasetable.ErrHeld)
	var held *leasetable.HeldError
	require.ErrorAs(t, err, &held)
	assert.Equal(t, "a", held.Holder)
	assert.Equal(t, la.Token(), held.Token)
	assert.WithinDuration(t, la.ExpiresAt(), held.ExpiresAt, time.Millisecond)

	// The same owner cannot take it twice either: exclusion holds between
	// goroutines of one client.
	_, err = a.TryAcquire(ctx, "job")
	require.ErrorIs(t, err, leasetable.ErrHeld)

	require.NoError(t, la.Release(ctx))
	<-la.Done()
	assert.ErrorIs(t, la.Err(), leasetable.ErrReleased)
	assert.ErrorIs(t, context.Cause(la.Context()), leasetable.ErrReleased)
	require.NoError(t, la.Release(ctx), "second Release returns the first result")

	lb, err := b.TryAcquire(ctx, "job")
	require.NoError(t, err)
	assert.Greater(t, lb.Token(), la.Token())
	in, err := a.Info(ctx, "job")
	require.NoError(t, err)
	assert.True(t, in.Held)
	assert.Equal(t, "b", in.Owner)
	assert.Equal(t, lb.Token(), in.Token)
	require.NoError(t, lb.Release(ctx))
}

func TestTokensStrictlyIncrease(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 60*time.Second)
	const workers, rounds = 4, 25
	var mu sync.Mutex
	var grants []int64 // in grant order: appended while the lease is held
	var wg sync.WaitGroup
	for w := range workers {
		c := newClient(t, pool, leasetable.Config{Owner: "w" + string(rune('0'+w))})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				l, err := c.Acquire(ctx, "name")
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				grants = append(grants, l.Token())
				mu.Unlock()
				assert.NoError(t, l.Release(ctx))
			}
		}()
	}
	wg.Wait()
	require.Len(t, grants, workers*rounds)
	for i := 1; i < len(grants); i++ {
		require.Greater(t, grants[i], grants[i-1], "grant %d", i)
	}

	// Takeover after expiry also gets a larger token.
	c := newClient(t, pool, leasetable.Config{Owner: "late"})
	l := stealAfterExpiry(t, pool, c, "name")
	assert.Greater(t, l.Token(), grants[len(grants)-1])
}

// stealAfterExpiry makes a stale grant of name by another owner (via SQL,
// with a 1ms TTL), lets it expire, and takes it over with c.
func stealAfterExpiry(t *testing.T, pool *pgxpool.Pool, c *leasetable.Client, name string) *leasetable.Lease {
	t.Helper()
	ctx := pgtest.Context(t, 30*time.Second)
	var tok int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire($1, 'ghost', 1)", name).Scan(&tok))
	l, err := c.Acquire(ctx, name) // waits for the expiry
	require.NoError(t, err)
	require.Greater(t, l.Token(), tok)
	return l
}

func TestRenewAfterExpiryNeverResurrects(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	q := func(sql string, args ...any) (n int) {
		rows, err := pool.Query(ctx, sql, args...)
		require.NoError(t, err)
		for rows.Next() {
			n++
		}
		require.NoError(t, rows.Err())
		return n
	}
	var tok int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire('r', 'old', 1)").Scan(&tok))
	pgtestWaitExpired(t, pool, "r")
	// Expired, nobody took it: renew still fails (an expired grant is gone).
	assert.Zero(t, q("SELECT * FROM pgbaton.renew('r', 'old', $1, 60000)", tok))
	// Taken over: renew of the old grant fails and changes nothing.
	var tok2 int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire('r', 'new', 60000)").Scan(&tok2))
	var before, after string
	require.NoError(t, pool.QueryRow(ctx, "SELECT row_to_json(l)::text FROM pgbaton.lease l WHERE name = 'r'").Scan(&before))
	assert.Zero(t, q("SELECT * FROM pgbaton.renew('r', 'old', $1, 60000)", tok))
	assert.Zero(t, q("SELECT * FROM pgbaton.renew('r', 'new', $1, 60000)", tok), "right owner, wrong token")
	assert.Zero(t, q("SELECT * FROM pgbaton.renew('r', 'old', $1, 60000)", tok2), "right token, wrong owner")
	require.NoError(t, pool.QueryRow(ctx, "SELECT row_to_json(l)::text FROM pgbaton.lease l WHERE name = 'r'").Scan(&after))
	assert.Equal(t, before, after)
	// Deleted row: renew never inserts.
	assert.Equal(t, 1, q("SELECT 1 WHERE pgbaton.complete('r', 'new', $1)", tok2))
	assert.Zero(t, q("SELECT * FROM pgbaton.renew('r', 'new', $1, 60000)", tok2))
	assert.Zero(t, q("SELECT 1 FROM pgbaton.lease WHERE name = 'r'"))

	// Through the Go API: a lease whose grant was taken over loses on Renew.
	c := newClient(t, pool, leasetable.Config{Owner: "go", TTL: time.Minute})
	l, err := c.TryAcquire(ctx, "g")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE pgbaton.lease SET owner = 'thief', token = nextval('pgbaton.lease_token_seq') WHERE name = 'g'")
	require.NoError(t, err)
	require.ErrorIs(t, l.Renew(ctx), leasetable.ErrNotHeld)
	<-l.Done()
	assert.ErrorIs(t, l.Err(), leasetable.ErrLeaseLost)
	in, err := c.Info(ctx, "g")
	require.NoError(t, err)
	assert.Equal(t, "thief", in.Owner)
}

func pgtestWaitExpired(t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	ctx := pgtest.Context(t, 10*time.Second)
	var wait time.Duration
	require.NoError(t, pool.QueryRow(ctx,
		"SELECT greatest(0, extract(epoch FROM expires_at - clock_timestamp()) * 1e9)::bigint FROM pgbaton.lease_status WHERE name = $1", name).Scan(&wait))
	time.Sleep(wait + time.Millisecond) // waiting for the database clock itself, not for another goroutine
}

func TestStaleReleaseLeavesNewHolderAlone(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	// A holder that stopped renewing: its grant expires and is taken over.
	oldC, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "old", TTL: 300 * time.Millisecond, RenewInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	defer oldC.Close(ctx)
	lOld, err := oldC.TryAcquire(ctx, "s")
	require.NoError(t, err)
	// Block its keep-alives until the grant expires.
	unblock := pgtest.BlockKeepalives(t, pool, "old")
	<-lOld.Done() // local deadline passes: the holder knows first
	assert.ErrorIs(t, lOld.Err(), leasetable.ErrLeaseLost)
	unblock()

	newC := newClient(t, pool, leasetable.Config{Owner: "new"})
	lNew, err := newC.Acquire(ctx, "s")
	require.NoError(t, err)
	require.Greater(t, lNew.Token(), lOld.Token())

	err = lOld.Release(ctx)
	require.ErrorIs(t, err, leasetable.ErrNotHeld)
	in, err := newC.Info(ctx, "s")
	require.NoError(t, err)
	assert.True(t, in.Held)
	assert.Equal(t, "new", in.Owner)
	assert.Equal(t, lNew.Token(), in.Token)
	assert.NoError(t, lNew.Err())
}

func TestLocalDeadlineBeforeDatabaseExpiry(t *testing.T) {
	// Keep-alives blocked (session row locked elsewhere): the holder must
	// see Done before the database would let anyone else in.
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	c := newClient(t, pool, leasetable.Config{Owner: "d", TTL: 3 * time.Second, SafetyMargin: 500 * time.Millisecond})
	l, err := c.TryAcquire(ctx, "d")
	require.NoError(t, err)
	defer pgtest.BlockKeepalives(t, pool, "d")()
	// No keep-alive gets through from here on: this is the expiry others
	// go by.
	var dbExpiry time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT expires_at FROM pgbaton.lease_status WHERE name = 'd'").Scan(&dbExpiry))
	<-l.Done()
	doneAt := time.Now()
	assert.ErrorIs(t, l.Err(), leasetable.ErrLeaseLost)
	assert.False(t, doneAt.Before(l.Deadline()), "Done before the local deadline")
	// The server runs on this host, so the clocks agree: the holder gave
	// up before the database expiry.
	assert.True(t, doneAt.Before(dbExpiry), "Done at %s, database expiry %s", doneAt, dbExpiry)
	assert.Equal(t, l.ExpiresAt(), dbExpiry, "no keep-alive got through")
}

func TestAutoRenewKeepsLease(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	c := newClient(t, pool, leasetable.Config{TTL: shortTTL})
	l, err := c.TryAcquire(ctx, "k")
	require.NoError(t, err)
	first := l.ExpiresAt()
	// More than two TTLs pass; the lease stays held and its expiry moves.
	var renewed int
	require.NoError(t, pool.QueryRow(ctx, "SELECT 1 FROM pg_sleep(2.2)").Scan(&renewed))
	assert.NoError(t, l.Err())
	assert.True(t, l.ExpiresAt().After(first.Add(time.Second)))
	in, err := c.Info(ctx, "k")
	require.NoError(t, err)
	assert.True(t, in.Held)
	require.NoError(t, l.Release(ctx))
}

func TestClockTimestampInsideOldTransaction(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SELECT now()") // the transaction's now() is fixed here
	require.NoError(t, err)
	// Someone takes a 200ms lease and it expires while tx is open.
	var tok int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire('c', 'other', 200)").Scan(&tok))
	pgtestWaitExpired(t, pool, "c")
	// By now() it would still be alive; by clock_timestamp() it expired.
	var got int64
	var exp time.Time
	require.NoError(t, tx.QueryRow(ctx, "SELECT token, expires_at FROM pgbaton.try_acquire('c', 'me', 60000)").Scan(&got, &exp))
	assert.Greater(t, got, tok)
	var nowTx time.Time
	require.NoError(t, tx.QueryRow(ctx, "SELECT now()").Scan(&nowTx))
	assert.True(t, exp.After(nowTx.Add(60*time.Second)), "expiry computed from the current time, not the transaction start")
	var renewed time.Time
	require.NoError(t, tx.QueryRow(ctx, "SELECT expires_at FROM pgbaton.renew('c', 'me', $1, 60000)", got).Scan(&renewed))
	assert.False(t, renewed.Before(exp))
}

func TestContendedAttemptWritesNoWAL(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: time.Minute})
	b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: time.Minute})
	l, err := a.TryAcquire(ctx, "w")
	require.NoError(t, err)
	defer l.Release(ctx)
	// The WAL position is the whole cluster's, and the cluster is shared
	// with tests running in parallel, whose writes land in the same window.
	// Their WAL only adds, so the least of a few rounds is this client's
	// own; a row lock or xid per attempt would be 50+ bytes each in every
	// round.
	const attempts, rounds = 200, 5
	least := math.Inf(1)
	for range rounds {
		var before, after string
		require.NoError(t, pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&before))
		for range attempts {
			_, err := b.TryAcquire(ctx, "w")
			require.ErrorIs(t, err, leasetable.ErrHeld)
		}
		require.NoError(t, pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&after))
		var bytes float64
		require.NoError(t, pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)", after, before).Scan(&bytes))
		t.Logf("WAL per failed attempt: %.2f bytes (%d attempts, whole cluster)", bytes/attempts, attempts)
		least = min(least, bytes/attempts)
		if least < 10 {
			break
		}
	}
	assert.Less(t, least, 10.0)
}

func TestWaiterWakesOnRelease(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 60*time.Second)
	// A TTL of a minute: only the release notification can wake the
	// waiter within the test's time.
	holder := newClient(t, pool, leasetable.Config{Owner: "h", TTL: time.Minute})
	waiting := make(chan string, 1)
	waiter := newClient(t, pool, leasetable.Config{Owner: "w", TTL: time.Minute, Logger: logTo(waiting)})
	const rounds = 100
	lat := make([]time.Duration, 0, rounds)
	for range rounds {
		l, err := holder.TryAcquire(ctx, "wake")
		require.NoError(t, err)
		got := make(chan *leasetable.Lease)
		go func() {
			wl, err := waiter.Acquire(ctx, "wake")
			assert.NoError(t, err)
			got <- wl
		}()
		// Release once the waiter has seen the lease held and waits.
		require.Equal(t, "wake", <-waiting)
		start := time.Now()
		require.NoError(t, l.Release(ctx))
		wl := <-got
		lat = append(lat, time.Since(start))
		require.NotNil(t, wl)
		require.NoError(t, wl.Release(ctx))
	}
	p50, p99 := percentile(lat, 50), percentile(lat, 99)
	t.Logf("handover after release (release call + NOTIFY + acquire): p50 %s p99 %s over %d", p50, p99, rounds)
	assert.Less(t, p99, 5*time.Second, "woken by the notification, not a timer")
}

func TestBadInput(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	_, err := leasetable.New(ctx, nil, leasetable.Config{})
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	for _, cfg := range []leasetable.Config{
		{TTL: -time.Second},
		{TTL: time.Microsecond},
		{TTL: time.Second, RenewInterval: time.Second},
		{TTL: time.Second, RenewInterval: -1},
		{TTL: time.Second, SafetyMargin: time.Second},
		{TTL: time.Second, SafetyMargin: -1},
		{TTL: time.Second, SafetyMargin: 500 * time.Millisecond, RenewInterval: 600 * time.Millisecond},
		{Owner: strings.Repeat("o", 256)},
		{Owner: "a\x00b"},
	} {
		_, err := leasetable.New(ctx, pool, cfg)
		assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%+v", cfg)
	}
	c := newClient(t, pool, leasetable.Config{})
	for _, name := range []string{"", strings.Repeat("n", 256), "a\x00", "\xff\xfe"} {
		_, err := c.TryAcquire(ctx, name)
		assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%q", name)
		_, err = c.Acquire(ctx, name)
		assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%q", name)
		_, err = c.Claim(ctx, name, 1)
		assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%q", name)
		_, err = c.Register(ctx, "g", name)
		assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%q", name)
		_, err = c.Semaphore(ctx, name, 1)
		assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%q", name)
		assert.ErrorIs(t, c.Do(ctx, name, func(context.Context) error { return nil }), pgbaton.ErrInvalidArgument)
		_, err = c.Elect(ctx, name, "v")
		assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%q", name)
		_, err = c.Leader(ctx, name)
		assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%q", name)
		assert.ErrorIs(t, c.Campaign(ctx, name, "v", leasetable.Callbacks{OnStartedLeading: func(context.Context, int64) {}}), pgbaton.ErrInvalidArgument)
	}
	_, err = c.Claim(ctx, "g", 0)
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	_, err = c.Register(ctx, "g")
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	_, err = c.Semaphore(ctx, "sem", 0)
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	assert.ErrorIs(t, c.Do(ctx, "x", nil), pgbaton.ErrInvalidArgument)
	assert.ErrorIs(t, c.Campaign(ctx, "x", "v", leasetable.Callbacks{}), pgbaton.ErrInvalidArgument)
	assert.ErrorIs(t, c.Complete(ctx, nil), pgbaton.ErrInvalidArgument)
	work := func(context.Context, *leasetable.Lease) {}
	assert.ErrorIs(t, c.Keep(ctx, leasetable.KeepConfig{Group: "", Max: 1, Work: work}), pgbaton.ErrInvalidArgument)
	assert.ErrorIs(t, c.Keep(ctx, leasetable.KeepConfig{Group: "g", Max: 0, Work: work}), pgbaton.ErrInvalidArgument)
	assert.ErrorIs(t, c.Keep(ctx, leasetable.KeepConfig{Group: "g", Max: 1}), pgbaton.ErrInvalidArgument)
	// The SQL functions refuse bad input the same way.
	for _, sql := range []string{
		"SELECT * FROM pgbaton.try_acquire('', 'o', 1000)",
		"SELECT * FROM pgbaton.try_acquire('n', '', 1000)",
		"SELECT * FROM pgbaton.try_acquire('n', 'o', 0)",
		"SELECT * FROM pgbaton.renew('n', 'o', 1, -5)",
		"SELECT * FROM pgbaton.claim('g', 'o', 0, 1000)",
		"SELECT pgbaton.register('g', ARRAY['ok', ''])",
	} {
		_, err := pool.Exec(ctx, sql)
		assert.Error(t, err, sql)
	}
	// Nothing was written by any of it.
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM pgbaton.lease) + (SELECT count(*) FROM pgbaton.job_run) + (SELECT count(*) FROM pgbaton.cron_slot)").Scan(&n))
	assert.Zero(t, n)

	// A semaphore is refused with a different slot count and stays as it was.
	s, err := c.Semaphore(ctx, "sem", 2)
	require.NoError(t, err)
	other := newClient(t, pool, leasetable.Config{})
	_, err = other.Semaphore(ctx, "sem", 3)
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease WHERE lease_group = 'sem'").Scan(&n))
	assert.Equal(t, 2, n)
	require.NoError(t, s.Release(ctx))
	// A name registered in another group is refused, nothing created.
	_, err = c.Register(ctx, "other", "sem#0", "fresh")
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease WHERE name = 'fresh'").Scan(&n))
	assert.Zero(t, n)

	// Closed client.
	cc, err := leasetable.New(ctx, pool, leasetable.Config{})
	require.NoError(t, err)
	require.NoError(t, cc.Close(ctx))
	_, err = cc.TryAcquire(ctx, "x")
	assert.ErrorIs(t, err, pgbaton.ErrClosed)
	_, err = cc.Acquire(ctx, "x")
	assert.ErrorIs(t, err, pgbaton.ErrClosed)
	_, err = cc.Claim(ctx, "g", 1)
	assert.ErrorIs(t, err, pgbaton.ErrClosed)
	_, err = cc.Pool()
	assert.ErrorIs(t, err, pgbaton.ErrClosed)
}

func TestNotMigrated(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	d := env.EmptyDB(t)
	logs := &messages{}
	_, err := leasetable.New(ctx, d.Pool(t), leasetable.Config{Logger: slog.New(logs)})
	assert.ErrorIs(t, err, pgbaton.ErrNotMigrated)
	assert.True(t, logs.has("ERROR pgbaton: leasetable refused an unmigrated database"))

	// Migrated at New, schema gone later (a down migration): refused and
	// logged as an error, not retried silently.
	m := env.DB(t)
	pool := m.Pool(t)
	c, err := leasetable.New(ctx, pool, leasetable.Config{Logger: slog.New(logs)})
	require.NoError(t, err)
	defer func() { _ = c.Close(ctx) }() // its clean-up cannot reach the schema either
	require.NoError(t, c.Check(ctx))
	_, err = pool.Exec(ctx, "DROP SCHEMA pgbaton CASCADE")
	require.NoError(t, err)
	_, err = c.TryAcquire(ctx, "x")
	assert.ErrorIs(t, err, pgbaton.ErrNotMigrated)
	assert.True(t, logs.has("ERROR pgbaton: database refused leasetable"))
	assert.ErrorIs(t, c.Check(ctx), pgbaton.ErrNotMigrated)
}

func TestStandbyRefused(t *testing.T) {
	if env.Cluster() == nil {
		t.Skip("needs the throwaway cluster") // only with PGBATON_TEST_DSN
	}
	ctx := pgtest.Context(t, 2*time.Minute)
	migrated := env.DB(t)
	// The base backup begins with a checkpoint; one done now leaves it
	// almost nothing to write.
	_, err := env.AdminPool().Exec(ctx, "CHECKPOINT")
	require.NoError(t, err)
	standby := pgtest.NewStandby(t, env.Cluster())
	pool := pgtest.Pool(t, standby.URL(migrated.Name))
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		return pool.Ping(ctx) == nil, nil
	}, "standby has no copy of %s", migrated.Name)
	logs := &messages{}
	_, err = leasetable.New(ctx, pool, leasetable.Config{Logger: slog.New(logs)})
	assert.ErrorIs(t, err, pgbaton.ErrStandby)
	assert.True(t, logs.has("ERROR pgbaton: leasetable refused a standby"))
}

func TestAcquireRespectsContext(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: time.Minute})
	b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: time.Minute})
	l, err := a.TryAcquire(ctx, "x")
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = b.Acquire(wctx, "x")
	require.ErrorIs(t, err, context.DeadlineExceeded, "a timed-out waiter reports failure")
	assert.NoError(t, l.Err())
	require.NoError(t, l.Release(ctx))
}

func TestCloseReleasesAndLeavesNoConnections(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	c, err := leasetable.New(ctx, pool, leasetable.Config{TTL: time.Minute})
	require.NoError(t, err)
	l1, err := c.TryAcquire(ctx, "one")
	require.NoError(t, err)
	_, err = c.Register(ctx, "g", "g1", "g2")
	require.NoError(t, err)
	ls, err := c.Claim(ctx, "g", 5)
	require.NoError(t, err)
	require.Len(t, ls, 2)
	// Start the listener with a waiter that gives up.
	other := newClient(t, pool, leasetable.Config{TTL: time.Minute})
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = other.Acquire(wctx, "one")
	cancel()
	require.Error(t, err)
	require.NoError(t, c.Close(ctx))
	require.NoError(t, other.Close(ctx))
	for _, l := range append(ls, l1) {
		<-l.Done()
		assert.ErrorIs(t, l.Err(), leasetable.ErrReleased)
	}
	var held int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease WHERE owner IS NOT NULL").Scan(&held))
	assert.Zero(t, held)
	pool.Close()
	env.NoConnections(t, d)
}

// A release reports waiters only when someone registered (wait_for), and
// a client's registration goes away once it got the lease. (That the
// release itself never notifies: TestReleaseReportsWaitersAndDoesNotNotify.)
func TestReleaseReportsWaitersOnlyWhenSomeoneWaits(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	// The lease is taken, then somebody may queue for it, then it is
	// released (a free lease with waiters goes to them first).
	cycle := func(queue string) (waiters bool) {
		var tok int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire('n', 'o', 60000)").Scan(&tok))
		if queue != "" {
			_, err := pool.Exec(ctx, queue)
			require.NoError(t, err)
		}
		var ok bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT released, waiters FROM pgbaton.release('n', 'o', $1)", tok).Scan(&ok, &waiters))
		require.True(t, ok)
		return waiters
	}
	assert.False(t, cycle(""), "no waiter registered, yet waiters reported")
	assert.True(t, cycle("SELECT pgbaton.wait_for('n', 'someone/1')"))
	_, err := pool.Exec(ctx, "SELECT pgbaton.stop_waiting('n', 'someone/1')")
	require.NoError(t, err)
	assert.False(t, cycle(""))

	// A client's waiter registration goes away once it got the lease.
	holder := newClient(t, pool, leasetable.Config{Owner: "h", TTL: time.Minute})
	waiting := make(chan string, 1)
	waiter := newClient(t, pool, leasetable.Config{Owner: "w", TTL: time.Minute, Logger: logTo(waiting)})
	l, err := holder.TryAcquire(ctx, "n")
	require.NoError(t, err)
	got := make(chan *leasetable.Lease, 1)
	go func() {
		wl, err := waiter.Acquire(ctx, "n")
		assert.NoError(t, err)
		got <- wl
	}()
	<-waiting
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease_waiter WHERE name = 'n'").Scan(&n))
	assert.Equal(t, 1, n)
	require.NoError(t, l.Release(ctx))
	require.NoError(t, (<-got).Release(ctx))
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		err := pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease_waiter").Scan(&n)
		return n == 0, err
	}, "waiter registration left behind")
}

func TestLongMultibyteOwnerCanWait(t *testing.T) {
	// Waiter ids are the owner cut short plus a number; the cut must not
	// split a character.
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	holder := newClient(t, pool, leasetable.Config{Owner: "h", TTL: time.Minute})
	waiting := make(chan string, 1)
	owner := strings.Repeat("é", 127) // 254 bytes
	waiter := newClient(t, pool, leasetable.Config{Owner: owner, TTL: time.Minute, Logger: logTo(waiting)})
	l, err := holder.TryAcquire(ctx, "u")
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		wl, err := waiter.Acquire(ctx, "u")
		if err == nil {
			err = wl.Release(ctx)
		}
		got <- err
	}()
	require.Equal(t, "u", <-waiting)
	require.NoError(t, l.Release(ctx))
	require.NoError(t, <-got)
}

func TestCloseEndsWaits(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	holder := newClient(t, pool, leasetable.Config{Owner: "h", TTL: time.Minute})
	waiting := make(chan string, 1)
	waiter, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "w", TTL: time.Minute, Logger: logTo(waiting)})
	require.NoError(t, err)
	_, err = holder.TryAcquire(ctx, "c")
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(ctx, "c")
		got <- err
	}()
	<-waiting
	require.NoError(t, waiter.Close(ctx))
	require.ErrorIs(t, <-got, pgbaton.ErrClosed)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease_waiter").Scan(&n))
	assert.Zero(t, n, "Close removes the client's waiter registrations")
}

// Servers that only look like Postgres are refused at New, before any
// lease is taken: YugabyteDB caches sequences per connection, so tokens
// would not grow across connections; CockroachDB's semantics differ too.
func TestUnsupportedServerRefused(t *testing.T) {
	ctx := pgtest.Context(t, 30*time.Second)
	for _, server := range []struct{ version, name string }{
		{"CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27 01:53:43, go1.19.10)", "CockroachDB"},
		{"PostgreSQL 11.2-YB-2.18.0.0-b0 on x86_64-pc-linux-gnu, compiled by clang version 15.0.3", "YugabyteDB"},
	} {
		fake := pgtest.StartFakeServer(t, server.version, map[string]string{"server_version": "13.0.0"})
		_, err := leasetable.New(ctx, pgtest.Pool(t, fake.URL()), leasetable.Config{})
		require.ErrorIs(t, err, pgbaton.ErrUnsupportedServer)
		require.ErrorContains(t, err, server.name)
		for _, q := range fake.Queries() {
			require.NotContains(t, q, "lease", "nothing about leases reached the server")
		}
	}
}
