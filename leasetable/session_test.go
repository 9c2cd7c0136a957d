package leasetable_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// writeTxns is how many transactions that wrote anything have started in
// the cluster: the next transaction id, read without taking one.
func writeTxns(t testing.TB, pool *pgxpool.Pool) int64 {
	t.Helper()
	var x int64
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").Scan(&x))
	return x
}

// statementCounter records the statements a pool sends (pgx.QueryTracer).
type statementCounter struct {
	mu  sync.Mutex
	sql []string
}

func (s *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sql = append(s.sql, d.SQL)
	return ctx
}

func (s *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *statementCounter) snapshot() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sql)
}

// claimN registers n items in group and claims them all for c.
func claimN(t testing.TB, c *leasetable.Client, group string, n int) []*leasetable.Lease {
	t.Helper()
	ctx := context.Background()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%06d", group, i)
	}
	_, err := c.Register(ctx, group, names...)
	require.NoError(t, err)
	ls, err := c.Claim(ctx, group, n)
	require.NoError(t, err)
	require.Len(t, ls, n)
	return ls
}

// One client keeps many leases alive with one statement per renew
// interval, not one per lease.
func TestManyLeasesOneKeepalive(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	const n, ttl, hold = 20000, 3 * time.Second, 10 * time.Second
	c := newClient(t, pool, leasetable.Config{Owner: "many", TTL: ttl})
	leases := claimN(t, c, "shards", n)

	before := writeTxns(t, pool)
	start := time.Now()
	time.Sleep(hold) // the thing measured: what keeping them alive costs over time
	took := time.Since(start)
	writes := writeTxns(t, pool) - before
	lost := 0
	for _, l := range leases {
		if l.Err() != nil {
			lost++
		}
	}
	var held int
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pgbaton.lease_status WHERE owner = 'many' AND held").Scan(&held))
	perSec := float64(writes) / took.Seconds()
	t.Logf("%d leases, TTL %s, held %s: %d lost, %d held in the database, %d write transactions (%.1f/s)",
		n, ttl, took.Round(time.Millisecond), lost, held, writes, perSec)
	assert.Zero(t, lost)
	assert.Equal(t, n, held)
	assert.LessOrEqual(t, perSec, 3.0, "keep-alive cost must not grow with the leases held")
}

// When keep-alives stop getting through, every lease of the session is
// lost at its local deadline, before the database would let anyone else
// take it, and none is lost before its deadline.
//
// "Before the database expiry" is checked on what a holder reads, not on
// when this test's goroutine sees Done: the deadline the lease reports is
// before it, and once that deadline has passed Err reports the loss. The
// test used to take the time after each lease's Done in one loop over 501
// leases; on a busy 2-core machine under -race the loop reached one of
// them 2 ms after the database expiry, 200 ms (the SafetyMargin) after
// the loss.
func TestSessionLossEndsEveryLeaseInTime(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "s", TTL: 2 * time.Second})
	leases := claimN(t, c, "items", 500)
	// One more, granted later: its own deadline is later than the rest.
	_, err := c.Register(ctx, "items", "late")
	require.NoError(t, err)
	unblock := pgtest.BlockKeepalives(t, pool, "s")
	defer unblock()
	var dbExpiry time.Time
	require.NoError(t, pool.QueryRow(ctx,
		"SELECT min(expires_at) FROM pgbaton.lease_status WHERE owner = 's'").Scan(&dbExpiry))
	late, err := c.Claim(ctx, "items", 1)
	require.NoError(t, err)
	require.Len(t, late, 1)
	leases = append(leases, late[0])

	for _, l := range leases {
		dl := l.Deadline()
		if l != late[0] {
			require.True(t, dl.Before(dbExpiry), "%s has its deadline %s after the database expiry %s", l.Name(), dl, dbExpiry)
		}
		select {
		case <-l.Done():
		case <-ctx.Done():
			t.Fatalf("lease %s never ended", l.Name())
		}
		require.False(t, time.Now().Before(dl), "%s lost before its deadline", l.Name())
		require.ErrorIs(t, l.Err(), leasetable.ErrLeaseLost)
	}
	// The late one lived by its own grant, which the database counts too.
	assert.True(t, late[0].Deadline().After(dbExpiry.Add(-time.Second)))
}

// A lease force-released by an operator ends at the next keep-alive; the
// others of the session are untouched.
func TestForceReleaseEndsTheLeaseAtTheNextKeepalive(t *testing.T) {
	d := env.DB(t)
	sent := &statementCounter{}
	pool := d.Pool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = sent })
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "f", TTL: time.Second})
	leases := claimN(t, c, "items", 10)
	_, err := pool.Exec(ctx, "SELECT pgbaton.force_release_lease($1, 'test')", leases[3].Name())
	require.NoError(t, err)
	select {
	case <-leases[3].Done():
	case <-time.After(5 * time.Second):
		t.Fatal("force-released lease not ended")
	}
	require.ErrorIs(t, leases[3].Err(), leasetable.ErrLeaseLost)
	require.ErrorIs(t, leases[3].Err(), leasetable.ErrNotHeld)
	for i, l := range leases {
		if i != 3 {
			assert.NoError(t, l.Err())
		}
	}
	// The database no longer has the grant: nothing is sent to give it
	// back (Close waits for the client's background work).
	require.NoError(t, c.Close(ctx))
	for _, sql := range sent.snapshot() {
		assert.NotContains(t, sql, "pgbaton.release(", "a release was sent for a superseded grant")
	}
}

// An idle client writes nothing: its session lapses once no lease has
// been bound to it for a TTL, and the next grant opens a new one.
func TestIdleSessionLapses(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	// What the client sends, counted on its own pool: the cluster is
	// shared with other tests, whose writes a server-wide count would see.
	sent := &statementCounter{}
	cpool := d.Pool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = sent })
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, cpool, leasetable.Config{Owner: "idle", TTL: 500 * time.Millisecond})
	l, err := c.TryAcquire(ctx, "x")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	sessions := func() (n int) {
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease_session WHERE owner = 'idle'").Scan(&n))
		return n
	}
	require.Equal(t, 1, sessions())
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) { return sessions() == 0, nil }, "idle session still there")
	before := sent.snapshot()
	time.Sleep(time.Second) // nothing to keep alive: nothing should be sent
	// A keep-alive every RenewInterval would be 6 statements in that second.
	assert.Empty(t, sent.snapshot()[len(before):], "statements sent by an idle client")
	l, err = c.TryAcquire(ctx, "x")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
}

// A client that takes and gives back leases between its keep-alives uses
// its session, though it holds nothing when a keep-alive is due: the
// session is not closed idle under it. The owner used to look only at
// those instants, so a fleet client holding leases a few milliseconds at
// a time closed its session every TTL and opened a new one.
func TestSessionUsedBetweenKeepalivesStaysOpen(t *testing.T) {
	d := env.DB(t)
	sent := &statementCounter{}
	cpool := d.Pool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = sent })
	ctx := pgtest.Context(t, time.Minute)
	// A TTL long enough that a keep-alive slowed by a busy machine does
	// not lose the session, which would open a second one as well.
	c := newClient(t, cpool, leasetable.Config{Owner: "brief-holder", TTL: 3 * time.Second})
	calls := func(fn string) int { return countContaining(sent.snapshot(), "pgbaton."+fn+"(") }
	// Uses every 100ms, each holding a lease for one round trip, until
	// the session has had keep-alives for over two TTLs (RenewInterval is
	// a third of it; the idle close needs one whole TTL unused).
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for calls("session_keepalive") < 7 {
		l, err := c.TryAcquire(ctx, "brief")
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		<-tick.C
	}
	assert.Equal(t, 1, calls("session_open"), "lease sessions opened by a client that used its session all along")
}

// keepaliveTimes records when each keep-alive of a client's pool was sent.
type keepaliveTimes struct {
	mu sync.Mutex
	at []time.Time
}

func (k *keepaliveTimes) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pgbaton.session_keepalive(") {
		k.mu.Lock()
		k.at = append(k.at, time.Now())
		k.mu.Unlock()
	}
	return ctx
}

func (k *keepaliveTimes) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (k *keepaliveTimes) gaps() []time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	var d []time.Duration
	for i := 1; i < len(k.at); i++ {
		d = append(d, k.at[i].Sub(k.at[i-1]))
	}
	return d
}

// A client whose leases each live shorter than a renew interval needs no
// keep-alive for them (each is held by its own grant until its own
// deadline): its session is kept alive only so that it does not lapse, a
// renew interval before its deadline, every TTL - SafetyMargin -
// RenewInterval (3.4s here) rather than every RenewInterval (2s). In a
// fleet of 500 such clients that is 59 write transactions a second rather
// than 100. Load only lengthens the gaps; a hold longer than the renew
// interval (a release slowed that much) makes one due earlier, so the
// median is compared, midway between the two.
func TestBriefLeasesKeepAliveOnlyAgainstLapse(t *testing.T) {
	d := env.DB(t)
	kt := &keepaliveTimes{}
	cpool := d.Pool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = kt })
	ctx := pgtest.Context(t, 2*time.Minute)
	c := newClient(t, cpool, leasetable.Config{Owner: "brief-keepalive", TTL: 6 * time.Second})
	cfg := c.Config()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for len(kt.gaps()) < 4 {
		l, err := c.TryAcquire(ctx, "brief-keepalive")
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		<-tick.C
	}
	gaps := kt.gaps()
	slices.Sort(gaps)
	lapse := cfg.TTL - cfg.SafetyMargin - cfg.RenewInterval
	assert.Greater(t, gaps[len(gaps)/2], (lapse+cfg.RenewInterval)/2,
		"keep-alives of a session whose leases live shorter than RenewInterval %s (gaps %v)", cfg.RenewInterval, gaps)

	// A lease held longer is kept alive every renew interval from its
	// grant, as before.
	l, err := c.TryAcquire(ctx, "held-long")
	require.NoError(t, err)
	n := len(kt.gaps())
	pgtest.Eventually(t, time.Minute, func() (bool, error) { return len(kt.gaps()) >= n+3, nil }, "keep-alives while holding")
	gaps = kt.gaps()[n+1:]
	slices.Sort(gaps)
	assert.Less(t, gaps[0], lapse, "keep-alives while a lease is held (gaps %v)", gaps)
	require.NoError(t, l.Err(), "the lease held across the keep-alives")
	require.NoError(t, l.Release(ctx))
}

// A grant waiting for another grant to open the client's session gives up
// at its own context's deadline: opening the session is stalled here (the
// session table is locked), and the second Acquire must not wait for it.
func TestSessionOpenHonoursContext(t *testing.T) {
	d := env.DB(t)
	direct := d.Pool(t)
	c := newClient(t, direct, leasetable.Config{TTL: 5 * time.Second, Owner: "stalled-open"})
	locker := pgtest.Connect(t, d.URL, "locker")
	ctx := pgtest.Context(t, time.Minute)
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE pgbaton.lease_session IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	first := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, "first")
		first <- err
	}()
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		n := pgtest.Count(t, direct, "SELECT count(*) FROM pg_locks l JOIN pg_class r ON r.oid = l.relation WHERE r.relname = 'lease_session' AND NOT l.granted")
		return n > 0, nil
	}, "the first Acquire never waited to open the session")

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	second := make(chan error, 1)
	go func() {
		_, err := c.Acquire(short, "second")
		second <- err
	}()
	select {
	case err := <-second:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(5 * time.Second):
		t.Error("the second Acquire did not return at its context's deadline while the session was being opened")
	}
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, <-first)
	if t.Failed() {
		<-second
	}
}

// The session's keep-alive runs on a timer, beside the caller's own
// statements on the same pool. Sent while a caller's statement held the
// pool's only connection, it made the pool open a second one, for good: a
// fleet of 500 clients with pools of 2 opened 0.9 connections per client
// in a 10s run, most of them beside a keep-alive. Here the caller takes
// the pool's connection right after a keep-alive and holds it past the
// next one's due time: that keep-alive waits for it (up to a quarter of
// RenewInterval) rather than open a second connection.
func TestKeepaliveLeavesThePoolToTheCaller(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, time.Minute)
	tr := &keepaliveTracer{replied: make(chan time.Time, 16)}
	own := d.Pool(t, func(c *pgxpool.Config) {
		c.MaxConns = 2
		c.ConnConfig.Tracer = tr
	})
	const renew = 2 * time.Second // the keep-alive may wait up to 500ms
	c := newClient(t, own, leasetable.Config{Owner: "busy", TTL: 3 * renew})
	l, err := c.TryAcquire(ctx, "k")
	require.NoError(t, err)
	for round := range 2 {
		var replied time.Time
		select {
		case replied = <-tr.replied:
		case <-ctx.Done():
			t.Fatal("no keep-alive")
		}
		pgtest.Eventually(t, 10*time.Second, func() (bool, error) { return own.Stat().AcquiredConns() == 0, nil },
			"round %d: the keep-alive's connection back in the pool", round)
		conn, err := own.Acquire(ctx)
		require.NoError(t, err)
		// The next keep-alive is due renew after the reply: hold the
		// connection across that, then give it back.
		_, err = conn.Exec(ctx, "SELECT pg_sleep($1::float8)", time.Until(replied.Add(renew+200*time.Millisecond)).Seconds())
		conn.Release()
		require.NoError(t, err)
		require.Equal(t, int32(1), own.Stat().TotalConns(), "round %d: the pool opened a connection beside the caller's", round)
	}
	require.NoError(t, l.Err())
	// Counted before the Release: a Release does not wait for an idle
	// connection, and one sent while a keep-alive holds the connection
	// has the pool open another (the full package run saw 2).
	assert.Equal(t, int64(1), own.Stat().NewConnsCount(), "connections the pool opened")
	require.NoError(t, l.Release(ctx))
}

// keepaliveTracer tells when a keep-alive's reply came.
type keepaliveTracer struct{ replied chan time.Time }

type keepaliveKey struct{}

func (k *keepaliveTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, keepaliveKey{}, strings.Contains(d.SQL, "session_keepalive"))
}

func (k *keepaliveTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if ka, _ := ctx.Value(keepaliveKey{}).(bool); ka && d.Err == nil {
		select {
		case k.replied <- time.Now():
		default:
		}
	}
}

// A grant on its way keeps its client's session from lapsing idle: a
// TryAcquire held between taking its session and sending its grant while
// the session had carried nothing for a TTL must come back bound to a
// session that is kept alive, not to one closed under it, which left the
// lease to its own expiry and lost it a TTL later on a healthy client.
func TestGrantOnItsWayKeepsItsSession(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	var armed atomic.Bool
	stalled, resume := make(chan struct{}), make(chan struct{})
	leasetable.SetSessionTaken(t, func() {
		if armed.CompareAndSwap(true, false) {
			close(stalled)
			<-resume
		}
	})
	c := newClient(t, d.Pool(t), leasetable.Config{Owner: "idle-race", TTL: shortTTL})
	l, err := c.TryAcquire(ctx, "race")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx)) // the session is idle from now

	armed.Store(true)
	got := goAcquire(func() (*leasetable.Lease, error) { return c.TryAcquire(ctx, "race") })
	<-stalled
	// Held for longer than the idle limit (a TTL): either the session is
	// closed under the grant, or it is kept alive past two TTLs from here.
	var from time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&from))
	pgtest.Eventually(t, 20*time.Second, func() (bool, error) {
		open := pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_session WHERE owner = 'idle-race'")
		kept := pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_session WHERE owner = 'idle-race' AND expires_at > $1::timestamptz + $2 * interval '1 millisecond'",
			from, 2*shortTTL.Milliseconds())
		return open == 0 || kept > 0, nil
	}, "the session was neither closed nor kept alive")
	close(resume)
	r := <-got
	require.NoError(t, r.err)
	l = r.l

	// Held: kept alive past three TTLs after the grant.
	require.NoError(t, pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&from))
	pgtest.Eventually(t, 20*time.Second, func() (bool, error) {
		select {
		case <-l.Done():
			return false, fmt.Errorf("the lease granted as its session lapsed was lost: %w", l.Err())
		default:
		}
		n := pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_status WHERE name = 'race' AND token = $1 AND held AND expires_at > $2::timestamptz + $3 * interval '1 millisecond'",
			l.Token(), from, 3*shortTTL.Milliseconds())
		return n > 0, nil
	}, "the lease was not kept alive")
	require.NoError(t, l.Release(ctx))
}
