package leasetable_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/migrations"
)

// After a failover the pool still holds connections to the old primary,
// which is back as a read-only server (as Patroni demotes it): pgbaton
// calls must not keep failing on them. The first call after the flip
// drops them and is answered by the new primary of the multi-host DSN;
// leases held across the failover stay held.
func TestRoleFlipDropsStaleConnections(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	primary := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true})
	require.NoError(t, migrations.UpURL(ctx, primary.URL("postgres")))
	standby := pgtest.NewStandby(t, primary)
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		primary.Port(), standby.Port())
	pool := pgtest.Pool(t, dsn)
	c := newClient(t, pool, leasetable.Config{Owner: "flip", TTL: 10 * time.Second})
	held, err := c.TryAcquire(ctx, "before")
	require.NoError(t, err)
	// An item completed in a transaction that rolls back: its Release
	// after the flip gives the row back on the new primary.
	_, err = c.Register(ctx, "rolled", "r")
	require.NoError(t, err)
	rolled, err := c.Claim(ctx, "rolled", 1)
	require.NoError(t, err)
	require.Len(t, rolled, 1)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, c.CompleteTx(ctx, tx, rolled[0]))
	require.NoError(t, tx.Rollback(ctx))
	for range 4 { // several pooled connections to the old primary
		_, err := pool.Exec(ctx, "SELECT 1")
		require.NoError(t, err)
	}

	// The standby has everything, then the old primary goes read-only and
	// the standby is promoted. (The insert position: without fsync the
	// test cluster commits asynchronously, and the written position lags.)
	admin := pgtest.Pool(t, primary.URL("postgres"))
	var lsn string
	require.NoError(t, admin.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn))
	sb := pgtest.Pool(t, standby.URL("postgres"))
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		var caught bool
		err := sb.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&caught)
		return caught, err
	}, "standby did not catch up")
	_, err = admin.Exec(ctx, "ALTER SYSTEM SET default_transaction_read_only = on")
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "SELECT pg_reload_conf()")
	require.NoError(t, err)
	_, err = sb.Exec(ctx, "SELECT pg_promote()")
	require.NoError(t, err)

	// The next calls work at once, on the new primary: the first is the
	// release of the item whose completion rolled back.
	require.NoError(t, rolled[0].Release(ctx), "the first call after the flip")
	assert.Equal(t, 0, pgtest.Count(t, sb, "SELECT count(*) FROM pgbaton.lease WHERE name = 'r' AND owner IS NOT NULL"), "the item is free again")
	// Answered by the new primary, which grants nothing during the
	// failover grace (TestNoGrantBeforeFailoverGraceEnds in test/).
	_, err = c.TryAcquire(ctx, "after")
	var refused *leasetable.HeldError
	require.ErrorAs(t, err, &refused)
	assert.True(t, refused.Grace, "refused for the failover grace: %v", err)
	_, err = c.Register(ctx, "items", "a")
	require.NoError(t, err)
	var port int
	require.NoError(t, pool.QueryRow(ctx, "SELECT inet_server_port()").Scan(&port))
	assert.Equal(t, standby.Port(), port, "the pool now reaches the new primary")
	// The lease held across the flip is kept alive there.
	before := held.ExpiresAt()
	pgtest.Eventually(t, 20*time.Second, func() (bool, error) {
		return held.ExpiresAt().After(before), held.Err()
	}, "the lease was not kept alive on the new primary")
	require.NoError(t, held.Release(ctx))
}

// A connection that breaks after the server granted a lease but before
// the reply arrived: the call is sent again on a fresh connection with the
// same request id and gets the grant the first one made — not ErrHeld by
// itself, and no grant left behind.
func TestBrokenConnectionMidGrantIsReplayed(t *testing.T) {
	if env.Cluster() == nil {
		t.Skip("needs the throwaway cluster") // only with PGBATON_TEST_DSN
	}
	ctx := pgtest.Context(t, time.Minute)
	direct, c, pool, proxy := slowLinkWorker(t, ctx, "cut", "i1", "i2", "i3")
	warm, err := c.TryAcquire(ctx, "warm") // opens the lease session
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))

	const latency = 150 * time.Millisecond
	cutMidway := func(t *testing.T) {
		proxy.SetLatency(0)
		_, err := pool.Exec(ctx, "SELECT 1")
		require.NoError(t, err)
		proxy.SetLatency(latency)
		// The request is on the server at 150ms; its reply would be back
		// at 300ms: cut the connection in between.
		time.AfterFunc(220*time.Millisecond, func() {
			proxy.Cut()
			proxy.SetLatency(0)
		})
	}
	t.Run("TryAcquire", func(t *testing.T) {
		cutMidway(t)
		l, err := c.TryAcquire(ctx, "x")
		require.NoError(t, err, "sent again, the attempt finds its own grant")
		var owner string
		var token int64
		require.NoError(t, direct.QueryRow(ctx, "SELECT owner, token FROM pgbaton.lease WHERE name = 'x'").Scan(&owner, &token))
		assert.Equal(t, "cut", owner)
		assert.Equal(t, l.Token(), token)
		require.NoError(t, l.Release(ctx))
	})
	t.Run("Claim", func(t *testing.T) {
		cutMidway(t)
		ls, err := c.Claim(ctx, "items", 2)
		require.NoError(t, err)
		require.Len(t, ls, 2, "the claim returns what the first one granted, not more")
		assert.ElementsMatch(t, []string{"i1", "i2"}, heldBy(t, direct, "cut"))
		for _, l := range ls {
			require.NoError(t, l.Release(ctx))
		}
	})
}
