package leasetable_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// Each of leasetable's retention rules deletes what is older than its
// retention and keeps what it must: recent rows, leases of a group, held
// leases. The other tables are package retention's.
func TestPruneRules(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "c", Retention: leasetable.Retention{Disabled: true}})
	held, err := c.TryAcquire(ctx, "held-long")
	require.NoError(t, err)
	_, err = c.Register(ctx, "items", "old-item")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `
INSERT INTO pgbaton.lease_waiter (name, waiter, since) VALUES ('x', 'crashed/1', now() - interval '2 days'), ('x', 'live/1', now());
INSERT INTO pgbaton.lease (name, token, acquired_at) VALUES ('released-long-ago', 5, now() - interval '8 days'), ('released-now', 6, now());
UPDATE pgbaton.lease SET acquired_at = now() - interval '8 days' WHERE name IN ('held-long', 'old-item');
INSERT INTO pgbaton.lease_session (owner, ttl_ms, started_at, renewed_at, expires_at) VALUES
  ('crashed', 1000, now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour');
INSERT INTO pgbaton.cron_slot (job, scheduled_at, owner) VALUES ('j', now() - interval '10 days', 'o');`)
	require.NoError(t, err)

	got, err := leasetable.Prune(ctx, pool, leasetable.Retention{})
	require.NoError(t, err)
	t.Logf("pruned %v", got)
	assert.Equal(t, leasetable.Pruned{"lease_waiter": 1, "lease": 1, "lease_session": 1}, got)
	assert.Equal(t, 2, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE name IN ('held-long', 'old-item')"), "held and grouped leases stay")
	assert.NoError(t, held.Err())
	assert.Equal(t, 1, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE name = 'released-now'"))
	assert.Equal(t, 1, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_waiter"))
	assert.Equal(t, 1, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.cron_slot"), "other packages' tables are left to package retention")

	// Negative keeps forever; bad settings are refused.
	_, err = pool.Exec(ctx, "INSERT INTO pgbaton.lease (name, token, acquired_at) VALUES ('released-long-ago', 7, now() - interval '8 days')")
	require.NoError(t, err)
	got, err = leasetable.Prune(ctx, pool, leasetable.Retention{Leases: -1})
	require.NoError(t, err)
	assert.Zero(t, got["lease"])
	for _, r := range []leasetable.Retention{{Batch: -1}, {Interval: -time.Second}, {Waiters: time.Microsecond}} {
		_, err = leasetable.Prune(ctx, pool, r)
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
		_, err = leasetable.New(ctx, pool, leasetable.Config{Retention: r})
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	}
	_, err = leasetable.Prune(ctx, nil, leasetable.Retention{})
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
}

// A Client prunes its own tables in the background, one client of two at
// a time (the other waits for the retention lease), and leaves the other
// packages' tables alone.
func TestClientPrunesInBackground(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	_, err := pool.Exec(ctx, `
INSERT INTO pgbaton.lease (name, token, acquired_at)
SELECT 'old-' || i, i, now() - interval '8 days' FROM generate_series(1, 5000) i;
INSERT INTO pgbaton.lease_session (owner, ttl_ms, started_at, renewed_at, expires_at) VALUES
  ('crashed', 1000, now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour');
INSERT INTO pgbaton.cron_slot (job, scheduled_at, owner) VALUES ('j', now() - interval '10 days', 'o');`)
	require.NoError(t, err)
	r := leasetable.Retention{Interval: 100 * time.Millisecond, Batch: 1000}
	newClient(t, pool, leasetable.Config{Owner: "pruner-a", Retention: r})
	newClient(t, pool, leasetable.Config{Owner: "pruner-b", Retention: r})
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		return pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE name LIKE 'old-%'")+
			pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_session WHERE owner = 'crashed'") == 0, nil
	}, "old leases and dead sessions not pruned")
	assert.Equal(t, 1, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.cron_slot"))
}

// A million work items claimed and completed leave nothing behind, and
// the lease table does not grow from round to round. (Package retention's
// test does the same for a million cron slots and job runs.)
func TestCompletedItemsKeepLeaseTableBounded(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 10*time.Minute)
	const rows = 1_000_000
	// A million work items through the protocol (register, claim,
	// complete_many), in five rounds with a VACUUM after each, as
	// autovacuum would run: completed items leave nothing behind, and the
	// space of their rows is used again, so the table does not grow from
	// round to round. Autovacuum is off meanwhile for this table: its runs
	// there (a VACUUM of this table takes the lock the test's VACUUM needs
	// to truncate; an ANALYZE elsewhere holds a snapshot) can keep the
	// test's VACUUM from giving a round's space back, and the round's size
	// then says when autovacuum ran (one CI run: a round's 39 MB left,
	// where every other round left 0).
	_, err := pool.Exec(ctx, "ALTER TABLE pgbaton.lease SET (autovacuum_enabled = off)")
	require.NoError(t, err)
	start := time.Now()
	const batch, perRound = 20000, rows / 5
	var sizes, heaps []int64
	for b := range rows / batch {
		_, err := pool.Exec(ctx, `SELECT pgbaton.register('queue', ARRAY(SELECT 'item-' || i FROM generate_series($1::int, $2::int) i))`,
			b*batch, (b+1)*batch-1)
		require.NoError(t, err)
		var n int
		require.NoError(t, pool.QueryRow(ctx, `
WITH c AS (SELECT * FROM pgbaton.claim('queue', 'worker', $1, 60000))
SELECT count(*) FROM pgbaton.complete_many(ARRAY(SELECT name FROM c), ARRAY(SELECT token FROM c), 'worker')`, batch).Scan(&n))
		require.Equal(t, batch, n)
		if (b+1)*batch%perRound == 0 {
			_, err := pool.Exec(ctx, "VACUUM pgbaton.lease")
			require.NoError(t, err)
			var size, heap int64
			require.NoError(t, pool.QueryRow(ctx,
				"SELECT pg_total_relation_size('pgbaton.lease'), pg_relation_size('pgbaton.lease')").Scan(&size, &heap))
			sizes, heaps = append(sizes, size), append(heaps, heap)
		}
	}
	t.Logf("registered, claimed and completed %d items in %s; pgbaton.lease after each 200k: %v bytes (heap %v)",
		rows, time.Since(start).Round(time.Millisecond), sizes, heaps)
	assert.Zero(t, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE lease_group = 'queue'"), "completed items are deleted")
	// The heap's free space is reused (vacuum even truncates it: every
	// row is gone); index pages come back only after a later vacuum finds
	// nobody can still see them, so the indexes may grow somewhat more on a
	// busy machine, but not with every round: 5 rounds without reuse would
	// be 5 times the first.
	assert.LessOrEqual(t, float64(heaps[len(heaps)-1]), 1.1*float64(heaps[1]), "the lease table's heap kept growing")
	assert.Less(t, float64(sizes[len(sizes)-1]), 4*float64(sizes[0]), "the lease table with its indexes grew with every round")
	_, err = pool.Exec(ctx, "ALTER TABLE pgbaton.lease RESET (autovacuum_enabled)")
	require.NoError(t, err)
}

// Renewals one lease at a time (the SQL protocol's renew) are HOT
// updates: they touch no indexed column and the table leaves room on its
// pages. The session keep-alive updates one row per client.
func TestRenewalsAreHOT(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, time.Minute)
	const n, rounds = 500, 10
	// The counters are read once the connections that did the work have
	// closed (see pgtest.WaitTableStats): counters still unreported when
	// read counted 4,005 of 5,000 renewals HOT on PostgreSQL 13.
	conn, err := pgx.Connect(ctx, d.URL)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT count(*) FROM generate_series(1, $1) i, pgbaton.try_acquire('r-' || i, 'o', 60000)`, n)
	require.NoError(t, err)
	rows, err := conn.Query(ctx, "SELECT name, token FROM pgbaton.lease WHERE owner = 'o'")
	require.NoError(t, err)
	type grant struct {
		Name  string
		Token int64
	}
	grants, err := pgx.CollectRows(rows, pgx.RowToStructByPos[grant])
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	stats := d.Pool(t)
	before := pgtest.WaitTableStats(t, stats, "pgbaton.lease", func(s pgtest.TableStats) bool { return s.Inserted >= n })

	// Each lease renewed in a transaction of its own, as holders do.
	conn, err = pgx.Connect(ctx, d.URL)
	require.NoError(t, err)
	for range rounds {
		for _, g := range grants {
			_, err = conn.Exec(ctx, "SELECT * FROM pgbaton.renew($1, 'o', $2, 60000)", g.Name, g.Token)
			require.NoError(t, err)
		}
	}
	require.NoError(t, conn.Close(ctx))
	after := pgtest.WaitTableStats(t, stats, "pgbaton.lease", func(s pgtest.TableStats) bool {
		return s.Updated-before.Updated >= n*rounds
	})
	upd, hot := after.Updated-before.Updated, after.HotUpdated-before.HotUpdated
	t.Logf("per-lease renewals: %d updates, %d HOT (%.0f%%)", upd, hot, 100*float64(hot)/float64(upd))
	require.EqualValues(t, n*rounds, upd)
	assert.GreaterOrEqual(t, float64(hot)/float64(upd), 0.9)
}
