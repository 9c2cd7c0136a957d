package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/faultproxy"
	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/migrations"
)

// newTokenDB creates and migrates database "tokens" on c and returns its
// URL.
func newTokenDB(t *testing.T, ctx context.Context, c *pgcluster.Cluster) string {
	admin := pgtest.Pool(t, c.URL("postgres"))
	_, err := admin.Exec(ctx, "CREATE DATABASE tokens")
	require.NoError(t, err)
	admin.Close()
	require.NoError(t, migrations.UpURL(ctx, c.URL("tokens")))
	return c.URL("tokens")
}

// grantMany grants and releases n leases in turn on a few names starting
// with prefix and returns the largest token granted.
func grantMany(t *testing.T, ctx context.Context, lc *leasetable.Client, prefix string, n int) int64 {
	var top int64
	for i := range n {
		l, err := lc.TryAcquire(ctx, fmt.Sprintf("%s:%d", prefix, i%4))
		require.NoError(t, err)
		top = max(top, l.Token())
		require.NoError(t, l.Release(ctx))
	}
	return top
}

// A failover to an asynchronous standby that lacks the last grants: the
// standby streams through a proxy that is stalled while 500 grants are
// acknowledged on the primary; the primary crashes and the standby is
// promoted. Its sequence is behind, but every token it grants is still
// larger than every token granted before, so a stale holder's fenced
// writes lose. (With a plain sequence the first token on the new primary
// was 34 after tokens up to 521.)
func TestTokensMonotonicAcrossLossyPromotion(t *testing.T) {
	ctx := pgtest.Context(t, 3*time.Minute)
	primary := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true})
	url := newTokenDB(t, ctx, primary)
	graceOff(t, ctx, pgtest.Pool(t, url)) // about tokens: the new primary grants at once
	proxy, err := faultproxy.New(fmt.Sprintf("127.0.0.1:%d", primary.Port()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	standby := pgtest.NewStandby(t, primary, pgcluster.Config{NoFsync: true, Settings: map[string]string{
		"primary_conninfo": fmt.Sprintf("host=127.0.0.1 port=%d user=postgres sslmode=disable", proxy.Port()),
	}})

	pool := pgtest.Pool(t, url)
	lc, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "old-primary", TTL: time.Minute})
	require.NoError(t, err)
	replicated := grantMany(t, ctx, lc, "tokens", 20)
	spool := pgtest.Pool(t, standby.URL("tokens"))
	waitReplayed(t, ctx, pool, spool)

	proxy.Stall()
	before := grantMany(t, ctx, lc, "tokens", 500) // acknowledged; never reach the standby
	// The last grant's holder keeps it and writes under it.
	stale, err := lc.TryAcquire(ctx, "tokens:stale")
	require.NoError(t, err)
	before = max(before, stale.Token())
	_, err = fencedwrite.PutValue(ctx, pool, "tokens:value", stale.Token(), json.RawMessage(`"old primary"`))
	require.NoError(t, err)
	require.NoError(t, primary.Halt(pgcluster.Immediate)) // a crash: nothing more leaves it
	proxy.Cut()
	require.NoError(t, proxy.Close())
	_ = lc.Close(ctx) // fails: its server is gone

	_, err = spool.Exec(ctx, "SELECT pg_promote()")
	require.NoError(t, err)
	var seq int64
	require.NoError(t, spool.QueryRow(ctx, "SELECT last_value FROM pgbaton.lease_token_seq").Scan(&seq))
	require.Less(t, seq, before-400, "the standby was not behind: the test lost no grant")

	nc, err := leasetable.New(ctx, spool, leasetable.Config{Owner: "new-primary", TTL: time.Minute})
	require.NoError(t, err)
	defer nc.Close(ctx)
	l, err := nc.TryAcquire(ctx, "after:first")
	require.NoError(t, err)
	t.Logf("tokens up to %d granted before the failover (%d replicated); first token on the new primary %d", before, replicated, l.Token())
	require.Greater(t, l.Token(), before, "a token granted after the promotion is not larger than every token granted before it")
	require.NoError(t, l.Release(ctx))
	after := grantMany(t, ctx, nc, "after", 10)
	assert.Greater(t, after, l.Token())

	// The new holder of the stale holder's lease writes; the stale holder,
	// whose grant the failover lost, cannot overwrite it.
	taken, err := nc.TryAcquire(ctx, "tokens:stale")
	require.NoError(t, err)
	_, err = fencedwrite.PutValue(ctx, spool, "tokens:value", taken.Token(), json.RawMessage(`"new primary"`))
	require.NoError(t, err)
	_, err = fencedwrite.PutValue(ctx, spool, "tokens:value", stale.Token(), json.RawMessage(`"stale holder"`))
	require.ErrorIs(t, err, fencedwrite.ErrStaleToken)
}

// waitReplayed waits until the standby has replayed everything the
// primary has written so far.
func waitReplayed(t *testing.T, ctx context.Context, primary, standby *pgxpool.Pool) {
	var lsn string
	require.NoError(t, primary.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn))
	pgtest.Eventually(t, time.Minute, func() (bool, error) {
		var ok bool
		err := standby.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&ok)
		return ok, err
	}, "standby did not replay up to %s", lsn)
}

// A crash of the server restarted in place keeps tokens monotonic even
// for clients that turned synchronous_commit off: a grant is flushed
// before it is acknowledged. The WAL writer is slowed down so that
// asynchronous commits stay in memory until the crash. (With a plain
// sequence and no durability check, hundreds of acknowledged grants were
// lost and their tokens handed out again.)
func TestTokensMonotonicAcrossCrashWithAsyncCommit(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	c := pgtest.NewCluster(t, pgcluster.Config{Settings: map[string]string{
		"wal_writer_delay": "10s", "wal_writer_flush_after": "1GB", "bgwriter_lru_maxpages": "0",
	}})
	url := newTokenDB(t, ctx, c)
	pool := pgtest.Pool(t, url, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	})
	lc, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "async", TTL: time.Minute})
	require.NoError(t, err)
	before := grantMany(t, ctx, lc, "tokens", 300)
	require.NoError(t, lc.Close(ctx))
	pool.Close()

	require.NoError(t, c.Restart(ctx, pgcluster.Immediate)) // a crash, then crash recovery
	pool = pgtest.Pool(t, url)
	lc, err = leasetable.New(ctx, pool, leasetable.Config{Owner: "after", TTL: time.Minute})
	require.NoError(t, err)
	defer lc.Close(ctx)
	l, err := lc.TryAcquire(ctx, "tokens:0")
	require.NoError(t, err)
	t.Logf("tokens up to %d acknowledged before the crash; first after it %d", before, l.Token())
	require.Greater(t, l.Token(), before, "tokens acknowledged before the crash were handed out again")
}

// Timelines that jump forward, or start again at 1 in a new cluster (a
// restore of a dump, pg_upgrade): every token drawn on a new timeline is
// larger than every token before, whichever way the timeline moved.
// pg_resetwal moves the timeline forward, as a promotion would.
func TestTokensMonotonicAcrossTimelineResets(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	a := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true})
	url := newTokenDB(t, ctx, a)
	graceOff(t, ctx, pgtest.Pool(t, url)) // about tokens: every timeline grants at once
	var last int64
	grant := func(url string, tl int, round int) {
		pool := pgtest.Pool(t, url)
		defer pool.Close()
		var got int
		require.NoError(t, pool.QueryRow(ctx, "SELECT pgbaton.insert_timeline()").Scan(&got))
		require.Equal(t, tl, got)
		lc, err := leasetable.New(ctx, pool, leasetable.Config{Owner: fmt.Sprintf("round%d", round), TTL: time.Minute})
		require.NoError(t, err)
		defer lc.Close(ctx)
		prefix := fmt.Sprintf("round:%d", round)
		first, err := lc.TryAcquire(ctx, prefix)
		require.NoError(t, err)
		t.Logf("round %d, timeline %d: first token %d (epoch %d)", round, tl, first.Token(), first.Token()>>40)
		require.Greater(t, first.Token(), last, "round %d: a token went backwards", round)
		last = max(grantMany(t, ctx, lc, prefix, 5), first.Token())
	}
	grant(url, 1, 1)
	setTimeline(t, ctx, a, url, 5)
	grant(url, 5, 2)

	// Into a new cluster, on timeline 1.
	b := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true})
	admin := pgtest.Pool(t, b.URL("postgres"))
	_, err := admin.Exec(ctx, "CREATE DATABASE tokens")
	require.NoError(t, err)
	admin.Close()
	bin, err := pgcluster.FindBinDir()
	require.NoError(t, err)
	dump, err := exec.CommandContext(ctx, filepath.Join(bin, "pg_dump"), "--no-owner", "--no-privileges", "-d", url).Output()
	require.NoError(t, err)
	restore := exec.CommandContext(ctx, filepath.Join(bin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", b.URL("tokens"))
	restore.Stdin = bytes.NewReader(dump)
	out, err := restore.CombinedOutput()
	require.NoError(t, err, "restore: %s", out)
	grant(b.URL("tokens"), 1, 3)
	setTimeline(t, ctx, b, b.URL("tokens"), 2)
	grant(b.URL("tokens"), 2, 4)
}

// setTimeline stops c cleanly and makes it write its WAL on timeline tl
// (which pg_resetwal only moves forward) from the next segment on, then
// starts it again.
func setTimeline(t *testing.T, ctx context.Context, c *pgcluster.Cluster, url string, tl int) {
	pool := pgtest.Pool(t, url)
	var file string
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_walfile_name(pg_current_wal_lsn())").Scan(&file))
	pool.Close()
	// File names are timeline, log and segment, 8 hex digits each.
	seg, err := strconv.ParseUint(file[16:], 16, 32)
	require.NoError(t, err)
	next := fmt.Sprintf("%08X%s%08X", tl, file[8:16], seg+1)
	require.NoError(t, c.Halt(pgcluster.Fast))
	bin, err := pgcluster.FindBinDir()
	require.NoError(t, err)
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pg_resetwal"), "-l", next, "-D", filepath.Join(c.Dir(), "data"))
	if os.Geteuid() == 0 {
		cred, err := pgcluster.Unprivileged()
		require.NoError(t, err)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "pg_resetwal: %s", out)
	require.NoError(t, c.Restart(ctx, pgcluster.Fast))
}

// A server that does not let the client read its WAL position (Aurora
// PostgreSQL refuses pg_current_wal_lsn() unless wal_level is logical;
// here the function's EXECUTE is revoked): grants still work, with the
// epoch as it was.
func TestTokensWithoutWALPosition(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	d := env.DB(t)
	admin := d.Pool(t)
	role := fmt.Sprintf("nowal_%d", time.Now().UnixNano())
	for _, sql := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"GRANT USAGE ON SCHEMA pgbaton TO " + role,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgbaton TO " + role,
		"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA pgbaton TO " + role,
		"REVOKE EXECUTE ON FUNCTION pg_catalog.pg_current_wal_lsn() FROM PUBLIC",
	} {
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	t.Cleanup(func() {
		_, _ = env.AdminPool().Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE IF EXISTS "+role)
	})
	pool := pgtest.Pool(t, d.URL, func(c *pgxpool.Config) { c.ConnConfig.User = role })
	_, err := pool.Exec(ctx, "SELECT pg_current_wal_lsn()")
	require.Error(t, err, "the role may still read the WAL position")
	var tl *int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pgbaton.insert_timeline()").Scan(&tl))
	require.Nil(t, tl)
	lc, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "nowal", TTL: time.Minute})
	require.NoError(t, err)
	defer lc.Close(ctx)
	top := grantMany(t, ctx, lc, "nowal", 20)
	require.Less(t, top, int64(1)<<40, "epoch unchanged")
	var epoch int64
	require.NoError(t, admin.QueryRow(ctx, "SELECT epoch FROM pgbaton.token_epoch").Scan(&epoch))
	require.Zero(t, epoch)
}
