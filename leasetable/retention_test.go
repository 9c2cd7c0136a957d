package leasetable_test

import (
	"context"
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

func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// Each retention rule deletes what is older than its retention and keeps
// what it must: recent rows, a job's newest run, leases of a group, held
// leases.
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
INSERT INTO pgbaton.cron_slot (job, scheduled_at, owner) VALUES
  ('j', now() - interval '10 days', 'o'), ('j', now() - interval '1 day', 'o');
INSERT INTO pgbaton.job_run (job, owner, token, status, started_at, finished_at) VALUES
  ('only', 'o', 1, 'succeeded', now() - interval '100 days', now() - interval '100 days'),
  ('two', 'o', 1, 'succeeded', now() - interval '100 days', now() - interval '100 days'),
  ('two', 'o', 2, 'succeeded', now() - interval '90 days', now() - interval '90 days');
INSERT INTO pgbaton.event (at, action, target, reason) VALUES
  (now() - interval '400 days', 'force_release_lease', 'x', 'old'), (now(), 'force_release_lease', 'x', 'new');
INSERT INTO pgbaton.lease_waiter (name, waiter, since) VALUES ('x', 'crashed/1', now() - interval '2 days'), ('x', 'live/1', now());
INSERT INTO pgbaton.fenced_value (key, token, value, updated_at) VALUES
  ('old', 1, '{}', now() - interval '100 days'), ('new', 1, '{}', now());
INSERT INTO pgbaton.advisory_name (key, name, first_seen, last_seen) VALUES
  (pgbaton.advisory_key('old'), 'old', now() - interval '100 days', now() - interval '100 days'),
  (pgbaton.advisory_key('new'), 'new', now(), now());
INSERT INTO pgbaton.processed_message (consumer, message_id, processed_at) VALUES
  ('c', 'old', now() - interval '8 days'), ('c', 'new', now());
INSERT INTO pgbaton.lease (name, token, acquired_at) VALUES ('released-long-ago', 5, now() - interval '8 days'), ('released-now', 6, now());
UPDATE pgbaton.lease SET acquired_at = now() - interval '8 days' WHERE name IN ('held-long', 'old-item');
INSERT INTO pgbaton.lease_session (owner, ttl_ms, started_at, renewed_at, expires_at) VALUES
  ('crashed', 1000, now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour');`)
	require.NoError(t, err)

	got, err := leasetable.Prune(ctx, pool, leasetable.Retention{})
	require.NoError(t, err)
	t.Logf("pruned %v", got)
	assert.Equal(t, leasetable.Pruned{"cron_slot": 1, "job_run": 1, "event": 1, "lease_waiter": 1, "fenced_value": 1,
		"advisory_name": 1, "processed_message": 1, "lease": 1, "lease_session": 1}, got)
	assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM pgbaton.cron_slot"))
	assert.Equal(t, 2, count(t, pool, "SELECT count(*) FROM pgbaton.job_run"), "every job keeps its newest run")
	assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM pgbaton.job_run WHERE job = 'two' AND token = 2"))
	assert.Equal(t, 2, count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE name IN ('held-long', 'old-item')"), "held and grouped leases stay")
	assert.NoError(t, held.Err())
	assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE name = 'released-now'"))

	// Negative keeps forever; bad settings are refused.
	_, err = pool.Exec(ctx, "INSERT INTO pgbaton.cron_slot (job, scheduled_at, owner) VALUES ('j', now() - interval '10 days', 'o')")
	require.NoError(t, err)
	got, err = leasetable.Prune(ctx, pool, leasetable.Retention{CronSlots: -1})
	require.NoError(t, err)
	assert.Zero(t, got["cron_slot"])
	for _, r := range []leasetable.Retention{{Batch: -1}, {Interval: -time.Second}, {Events: time.Microsecond}} {
		_, err = leasetable.Prune(ctx, pool, r)
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	}
	_, err = leasetable.Prune(ctx, nil, leasetable.Retention{})
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
}

// A million cron slots and job runs written over 100 days, and a million
// work items claimed and completed: the background pruner of one of two
// clients (the other waits for the retention lease) brings the tables
// down to their retention and keeps them there while new rows come in.
func TestRetentionKeepsTablesBounded(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 10*time.Minute)
	const rows = 1_000_000
	start := time.Now()
	// 100 days of a job every 8.64s, over 100 job names.
	_, err := pool.Exec(ctx, `
INSERT INTO pgbaton.cron_slot (job, scheduled_at, owner, claimed_at)
SELECT 'job-' || (i % 100), now() - (i * interval '8.64 seconds'), 'o', now() - (i * interval '8.64 seconds')
  FROM generate_series(1, $1) i`, rows)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `
INSERT INTO pgbaton.job_run (job, owner, token, status, started_at, finished_at, heartbeat_at)
SELECT 'job-' || (i % 100), 'o', i, 'succeeded', now() - (i * interval '8.64 seconds'), now() - (i * interval '8.64 seconds'),
       now() - (i * interval '8.64 seconds')
  FROM generate_series(1, $1) i`, rows)
	require.NoError(t, err)
	t.Logf("wrote %d cron slots and %d job runs in %s", rows, rows, time.Since(start).Round(time.Millisecond))

	// A million work items through the protocol (register, claim,
	// complete_many), in five rounds with a VACUUM after each, as
	// autovacuum would run: completed items leave nothing behind, and the
	// space of their rows is used again, so the table does not grow from
	// round to round. Autovacuum is off meanwhile for the tables just
	// filled and this one: its runs there (an ANALYZE of the million cron
	// slots holds a snapshot; a VACUUM of this table takes the lock the
	// test's VACUUM needs to truncate) can keep the test's VACUUM from
	// giving a round's space back, and the round's size then says when
	// autovacuum ran (one CI run: a round's 39 MB left, where every other
	// round left 0).
	autovacuum := func(setting string) {
		for _, table := range []string{"pgbaton.lease", "pgbaton.cron_slot", "pgbaton.job_run"} {
			_, err := pool.Exec(ctx, "ALTER TABLE "+table+" "+setting)
			require.NoError(t, err)
		}
	}
	autovacuum("SET (autovacuum_enabled = off)")
	start = time.Now()
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
	assert.Zero(t, count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE lease_group = 'queue'"), "completed items are deleted")
	// The heap's free space is reused (vacuum even truncates it: every
	// row is gone); index pages come back only after a later vacuum finds
	// nobody can still see them, so the indexes may grow somewhat more on a
	// busy machine, but not with every round: 5 rounds without reuse would
	// be 5 times the first.
	assert.LessOrEqual(t, float64(heaps[len(heaps)-1]), 1.1*float64(heaps[1]), "the lease table's heap kept growing")
	assert.Less(t, float64(sizes[len(sizes)-1]), 4*float64(sizes[0]), "the lease table with its indexes grew with every round")
	autovacuum("RESET (autovacuum_enabled)")

	retention := leasetable.Retention{Interval: 200 * time.Millisecond, Batch: 10000}
	a := newClient(t, pool, leasetable.Config{Owner: "pruner-a", Retention: retention})
	b := newClient(t, pool, leasetable.Config{Owner: "pruner-b", Retention: retention})
	// The retention's share of the 100 days is what must be left.
	slotKept, runKept := rows*7/100, rows*30/100
	start = time.Now()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		slots := count(t, pool, "SELECT count(*) FROM pgbaton.cron_slot")
		runs := count(t, pool, "SELECT count(*) FROM pgbaton.job_run")
		if slots <= slotKept+100 && runs <= runKept+100 {
			t.Logf("pruned down to %d cron slots (7 of 100 days: %d) and %d job runs (30 of 100 days: %d) in %s",
				slots, slotKept, runs, runKept, time.Since(start).Round(time.Millisecond))
			// Not too far either: what is younger than its retention stays.
			assert.GreaterOrEqual(t, slots, slotKept-100, "cron slots younger than 7 days were pruned")
			assert.GreaterOrEqual(t, runs, runKept-100, "job runs younger than 30 days were pruned")
			break
		}
		require.True(t, time.Now().Before(deadline), "still %d cron slots and %d job runs", slots, runs)
		time.Sleep(200 * time.Millisecond) // poll the pruners' progress, bounded
	}
	require.NoError(t, a.Close(ctx))
	require.NoError(t, b.Close(ctx))
	_, err = pool.Exec(ctx, "TRUNCATE pgbaton.cron_slot, pgbaton.job_run")
	require.NoError(t, err)

	// Steady state, time compressed: retention 2s, 5,000 new slots and
	// runs a second for 16s. The tables hold about 2s of them, not all 80k.
	short := leasetable.Retention{Interval: 100 * time.Millisecond, Batch: 10000, CronSlots: 2 * time.Second, JobRuns: 2 * time.Second}
	newClient(t, pool, leasetable.Config{Owner: "pruner-c", Retention: short})
	const perTick, tick = 500, 100 * time.Millisecond
	// 2s of rows, plus up to 2s of lag for a pruner on a loaded machine.
	bound := int(4*time.Second/tick) * perTick
	peakSlots, peakRuns := 0, 0
	for i := range 160 {
		_, err := pool.Exec(ctx, `INSERT INTO pgbaton.cron_slot (job, scheduled_at, owner)
SELECT 'new-' || j, clock_timestamp() + ($1 * interval '1 microsecond'), 'o' FROM generate_series(1, $2) j`, i, perTick)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO pgbaton.job_run (job, owner, token, status, finished_at)
SELECT 'new-' || (j % 10), 'o', j, 'succeeded', clock_timestamp() FROM generate_series(1, $1) j`, perTick)
		require.NoError(t, err)
		if i >= 30 { // past the first retention period
			peakSlots = max(peakSlots, count(t, pool, "SELECT count(*) FROM pgbaton.cron_slot"))
			peakRuns = max(peakRuns, count(t, pool, "SELECT count(*) FROM pgbaton.job_run"))
		}
		time.Sleep(tick) // the pace of new work
	}
	t.Logf("steady state, 5,000 rows/s at a 2s retention over 16s (80,000 written): at most %d cron slots and %d job runs (bound %d)",
		peakSlots, peakRuns, bound)
	assert.LessOrEqual(t, peakSlots, bound)
	assert.LessOrEqual(t, peakRuns, bound)
}

// Renewals one lease at a time (the SQL protocol's renew) are HOT
// updates: they touch no indexed column and the table leaves room on its
// pages. The session keep-alive updates one row per client.
func TestRenewalsAreHOT(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, time.Minute)
	conn, err := pgx.Connect(ctx, d.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	const n, rounds = 500, 10
	_, err = conn.Exec(ctx, `SELECT count(*) FROM generate_series(1, $1) i, pgbaton.try_acquire('r-' || i, 'o', 60000)`, n)
	require.NoError(t, err)
	stat := func() (upd, hot int64) {
		_, _ = conn.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		require.NoError(t, conn.QueryRow(ctx, "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'pgbaton.lease'::regclass").Scan(&upd, &hot))
		return upd, hot
	}
	upd0, hot0 := stat()
	// Each lease renewed in a transaction of its own, as holders do.
	rows, err := conn.Query(ctx, "SELECT name, token FROM pgbaton.lease WHERE owner = 'o'")
	require.NoError(t, err)
	type grant struct {
		Name  string
		Token int64
	}
	grants, err := pgx.CollectRows(rows, pgx.RowToStructByPos[grant])
	require.NoError(t, err)
	for range rounds {
		for _, g := range grants {
			_, err = conn.Exec(ctx, "SELECT * FROM pgbaton.renew($1, 'o', $2, 60000)", g.Name, g.Token)
			require.NoError(t, err)
		}
	}
	upd, hot := stat()
	upd, hot = upd-upd0, hot-hot0
	t.Logf("per-lease renewals: %d updates, %d HOT (%.0f%%)", upd, hot, 100*float64(hot)/float64(upd))
	require.EqualValues(t, n*rounds, upd)
	assert.GreaterOrEqual(t, float64(hot)/float64(upd), 0.9)
}
