package test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/faultproxy"
	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// promoteWhileHeld starts a primary with database "tokens", where a client
// with the given TTL holds lease "held" and group "items" has an item and
// semaphore "sem" is full; starts a standby that has all of it, stops
// the primary as a crash would and promotes the standby. It returns a
// pool on the new primary. before runs on the primary first.
func promoteWhileHeld(t *testing.T, ctx context.Context, ttl time.Duration, before func(*pgxpool.Pool)) *pgxpool.Pool {
	primary := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true})
	url := newTokenDB(t, ctx, primary)
	pool := pgtest.Pool(t, url)
	if before != nil {
		before(pool)
	}
	old, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "old", TTL: ttl})
	require.NoError(t, err)
	_, err = old.TryAcquire(ctx, "held")
	require.NoError(t, err)
	_, err = old.Semaphore(ctx, "sem", 1)
	require.NoError(t, err)
	_, err = old.Register(ctx, "items", "item")
	require.NoError(t, err)
	standby := pgtest.NewStandby(t, primary)
	spool := pgtest.Pool(t, standby.URL("tokens"))
	waitReplayed(t, ctx, pool, spool)
	require.NoError(t, primary.Halt(pgcluster.Immediate))
	_ = old.Close(ctx) // fails: its server is gone
	_, err = spool.Exec(ctx, "SELECT pg_promote(true, 60)")
	require.NoError(t, err)
	return spool
}

// A promoted standby may lack grants the old primary acknowledged, and
// their holders keep working until their local deadlines. So the new
// primary grants nothing — no name, claim or semaphore slot, whether it
// was ever granted or not — until the longest TTL in use has passed since
// the new timeline first granted; waiters wait through the grace and get
// their leases after it.
func TestNoGrantBeforeFailoverGraceEnds(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	const ttl = 3 * time.Second
	spool := promoteWhileHeld(t, ctx, ttl, nil)

	nc, err := leasetable.New(ctx, spool, leasetable.Config{Owner: "new", TTL: time.Second})
	require.NoError(t, err)
	defer nc.Close(ctx)
	_, err = nc.TryAcquire(ctx, "never-granted")
	require.ErrorIs(t, err, leasetable.ErrHeld, "a name was granted during the grace")
	var held *leasetable.HeldError
	require.ErrorAs(t, err, &held)
	claimed, err := nc.Claim(ctx, "items", 1)
	require.NoError(t, err)
	assert.Empty(t, claimed, "an item was claimed during the grace")

	// Waiters wait through the grace, whatever they wait for.
	type got struct {
		what string
		l    *leasetable.Lease
		err  error
	}
	done := make(chan got, 3)
	go func() { l, err := nc.Acquire(ctx, "held"); done <- got{"held", l, err} }()
	go func() { l, err := nc.Acquire(ctx, "never-granted"); done <- got{"never-granted", l, err} }()
	go func() { l, err := nc.Semaphore(ctx, "sem", 1); done <- got{"sem", l, err} }()
	for range 3 {
		g := <-done
		require.NoError(t, g.err, g.what)
		var early bool
		require.NoError(t, spool.QueryRow(ctx, `SELECT acquired_at < (SELECT grace_until FROM pgbaton.token_epoch)
			FROM pgbaton.lease WHERE name = $1`, g.l.Name()).Scan(&early))
		assert.False(t, early, "%s was granted before the grace ended", g.what)
	}
	var graceMs int64
	require.NoError(t, spool.QueryRow(ctx, `SELECT (extract(epoch FROM grace_until - grace_started_at) * 1000)::bigint
		FROM pgbaton.token_epoch`).Scan(&graceMs))
	assert.GreaterOrEqual(t, graceMs, ttl.Milliseconds(), "the grace is the longest TTL in use")
	claimed, err = nc.Claim(ctx, "items", 1)
	require.NoError(t, err)
	assert.Len(t, claimed, 1, "claims work again after the grace")
}

// Turned off (for synchronous replication, where a failover loses no
// acknowledged grant), a new primary grants at once.
func TestFailoverGraceOff(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	spool := promoteWhileHeld(t, ctx, time.Minute, func(pool *pgxpool.Pool) {
		_, err := pool.Exec(ctx, "SELECT pgbaton.set_failover_grace(false, 'synchronous replication')")
		require.NoError(t, err)
	})
	nc, err := leasetable.New(ctx, spool, leasetable.Config{Owner: "new", TTL: time.Second})
	require.NoError(t, err)
	defer nc.Close(ctx)
	l, err := nc.TryAcquire(ctx, "never-granted")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	_, err = nc.TryAcquire(ctx, "held")
	require.True(t, errors.Is(err, leasetable.ErrHeld), "the replicated grant is still held: %v", err)
}

// graceOff turns the failover grace off in the database of pool, for
// tests of what happens across a timeline change other than the grace.
func graceOff(t *testing.T, ctx context.Context, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(ctx, "SELECT pgbaton.set_failover_grace(false, 'test: not about the grace')")
	require.NoError(t, err)
}

// A failover can lose a grant while the lease session it is bound to reaches
// the new primary (kept alive there from before the standby fell behind),
// so the session's keep-alives go on succeeding there. The client sees
// the timeline change in a keep-alive and ends the lease the new primary
// does not have, while the failover grace keeps anyone else from taking
// it; the lease the new primary has stays held.
func TestGrantLostInFailoverIsToldWhileSessionLives(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	primary := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true})
	url := newTokenDB(t, ctx, primary)
	proxy, err := faultproxy.New(fmt.Sprintf("127.0.0.1:%d", primary.Port()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	standby := pgtest.NewStandby(t, primary, pgcluster.Config{NoFsync: true, Settings: map[string]string{
		"primary_conninfo": fmt.Sprintf("host=127.0.0.1 port=%d user=postgres sslmode=disable", proxy.Port()),
	}})
	pool := pgtest.Pool(t, fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/tokens?sslmode=disable&target_session_attrs=read-write",
		primary.Port(), standby.Port()))
	lc, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "holder", TTL: 10 * time.Second, RenewInterval: 300 * time.Millisecond})
	require.NoError(t, err)
	defer lc.Close(ctx)
	kept, err := lc.TryAcquire(ctx, "kept")
	require.NoError(t, err)
	spool := pgtest.Pool(t, standby.URL("tokens"))
	waitReplayed(t, ctx, pgtest.Pool(t, url), spool)

	proxy.Stall()
	lost, err := lc.TryAcquire(ctx, "lost") // acknowledged; never reaches the standby
	require.NoError(t, err)
	// The standby's link goes first, so that no WAL sender of the
	// primary's waits on the stalled link while it is halted.
	proxy.Cut()
	require.NoError(t, proxy.Close())
	require.NoError(t, primary.Halt(pgcluster.Immediate))
	_, err = spool.Exec(ctx, "SELECT pg_promote(true, 60)")
	require.NoError(t, err)

	select {
	case <-lost.Done():
	case <-time.After(8 * time.Second):
		t.Fatal("the holder of the grant the failover lost was not told")
	}
	require.ErrorIs(t, lost.Err(), leasetable.ErrLeaseLost)
	t.Logf("told: %v", lost.Err())
	var active bool
	require.NoError(t, spool.QueryRow(ctx, "SELECT active FROM pgbaton.failover_grace()").Scan(&active))
	assert.True(t, active, "told before the failover grace ended")
	assert.NoError(t, kept.Err(), "the grant the new primary has is still held")
}

// The grace lasts the longest TTL any grant or lease session used, also one a
// renewal of the SQL protocol asked for: its holder counts on it as on a
// grant's.
func TestLongestTTLInUse(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pool := env.DB(t).Pool(t)
	longest := func() int64 {
		t.Helper()
		var ms int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT pgbaton.ttl_in_use()").Scan(&ms))
		return ms
	}
	require.Zero(t, longest(), "nothing granted yet")
	steps := []struct {
		sql string
		ms  int64
	}{
		{"SELECT pgbaton.try_acquire('a', 'o', 1000)", 1000},
		{"SELECT pgbaton.renew('a', 'o', (SELECT token FROM pgbaton.lease WHERE name = 'a'), 5000)", 5000},
		{"SELECT pgbaton.register('g', ARRAY['i']), pgbaton.claim('g', 'o', 1, 7000)", 7000},
		{"SELECT pgbaton.session_open('o', 9000)", 9000},
		{"SELECT pgbaton.session_keepalive((SELECT max(id) FROM pgbaton.lease_session), 11000)", 11000},
		{"SELECT pgbaton.try_acquire('b', 'o', 2000)", 11000}, // shorter: the longest stays
	}
	for _, s := range steps {
		_, err := pool.Exec(ctx, s.sql)
		require.NoError(t, err, s.sql)
		assert.Equal(t, s.ms, longest(), s.sql)
	}
}

// Only an operator (pgbaton_admin) turns the failover grace off, with a
// reason the audit log keeps; the setting is the only thing of the epoch
// row the operator can change.
func TestSetFailoverGraceNeedsAnOperator(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pool := env.DB(t).Pool(t)
	app := env.Role(t, ctx, pool, "grace_app", "")
	op := env.Role(t, ctx, pool, "grace_op", "pgbaton_admin")
	as := func(role, sql string) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sql)
			return err
		})
	}
	var pgErr *pgconn.PgError
	require.ErrorAs(t, as(app, "SELECT pgbaton.set_failover_grace(false, 'sync replication')"), &pgErr)
	assert.Equal(t, "42501", pgErr.Code, "not an operator")
	require.ErrorAs(t, as(op, "SELECT pgbaton.set_failover_grace(false, ' ')"), &pgErr)
	assert.Equal(t, "22023", pgErr.Code, "no reason")
	require.ErrorAs(t, as(op, "UPDATE pgbaton.token_epoch SET epoch = 0"), &pgErr)
	assert.Equal(t, "42501", pgErr.Code, "the epoch is not the operator's")
	require.NoError(t, as(op, "SELECT pgbaton.set_failover_grace(false, 'sync replication')"))
	var enabled bool
	var reason, actor string
	require.NoError(t, pool.QueryRow(ctx, "SELECT enabled FROM pgbaton.failover_grace()").Scan(&enabled))
	assert.False(t, enabled)
	require.NoError(t, pool.QueryRow(ctx, "SELECT reason, actor FROM pgbaton.event WHERE action = 'set_failover_grace'").Scan(&reason, &actor))
	assert.Equal(t, "sync replication", reason)
	assert.Equal(t, op, actor)
}
