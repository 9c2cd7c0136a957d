package retention_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/retention"
)

// Each retention rule deletes what is older than its retention and keeps
// what it must: recent rows, a job's newest run. leasetable's own tables
// are left to leasetable.
func TestPruneRules(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	_, err := pool.Exec(ctx, `
INSERT INTO pgbaton.cron_slot (job, scheduled_at, owner) VALUES
  ('j', now() - interval '10 days', 'o'), ('j', now() - interval '1 day', 'o');
INSERT INTO pgbaton.job_run (job, owner, token, status, started_at, finished_at) VALUES
  ('only', 'o', 1, 'succeeded', now() - interval '100 days', now() - interval '100 days'),
  ('two', 'o', 1, 'succeeded', now() - interval '100 days', now() - interval '100 days'),
  ('two', 'o', 2, 'succeeded', now() - interval '90 days', now() - interval '90 days');
INSERT INTO pgbaton.event (at, action, target, reason) VALUES
  (now() - interval '400 days', 'force_release_lease', 'x', 'old'), (now(), 'force_release_lease', 'x', 'new');
INSERT INTO pgbaton.fenced_value (key, token, value, updated_at) VALUES
  ('old', 1, '{}', now() - interval '100 days'), ('new', 1, '{}', now());
INSERT INTO pgbaton.advisory_name (key, name, first_seen, last_seen) VALUES
  (pgbaton.advisory_key('old'), 'old', now() - interval '100 days', now() - interval '100 days'),
  (pgbaton.advisory_key('new'), 'new', now(), now());
INSERT INTO pgbaton.processed_message (consumer, message_id, processed_at) VALUES
  ('c', 'old', now() - interval '8 days'), ('c', 'new', now());
INSERT INTO pgbaton.lease (name, token, acquired_at) VALUES ('released-long-ago', 5, now() - interval '8 days');`)
	require.NoError(t, err)

	got, err := retention.Prune(ctx, pool, retention.Config{})
	require.NoError(t, err)
	t.Logf("pruned %v", got)
	assert.Equal(t, retention.Pruned{"cron_slot": 1, "job_run": 1, "event": 1, "fenced_value": 1,
		"advisory_name": 1, "processed_message": 1}, got)
	assert.Equal(t, 1, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.cron_slot"))
	assert.Equal(t, 2, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.job_run"), "every job keeps its newest run")
	assert.Equal(t, 1, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.job_run WHERE job = 'two' AND token = 2"))
	for _, table := range []string{"event", "fenced_value", "advisory_name", "processed_message"} {
		assert.Equal(t, 1, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton."+table), "the new row of %s stays", table)
	}
	assert.Equal(t, 1, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease"), "leasetable's tables are leasetable's")

	// Negative keeps forever; bad settings are refused.
	_, err = pool.Exec(ctx, "INSERT INTO pgbaton.cron_slot (job, scheduled_at, owner) VALUES ('j', now() - interval '10 days', 'o')")
	require.NoError(t, err)
	got, err = retention.Prune(ctx, pool, retention.Config{CronSlots: -1})
	require.NoError(t, err)
	assert.Zero(t, got["cron_slot"])
	c, err := leasetable.New(ctx, pool, leasetable.Config{})
	require.NoError(t, err)
	defer c.Close(ctx)
	for _, cfg := range []retention.Config{{Batch: -1}, {Interval: -time.Second}, {Events: time.Microsecond}} {
		_, err = retention.Prune(ctx, pool, cfg)
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
		require.ErrorIs(t, retention.Run(ctx, c, cfg), pgbaton.ErrInvalidArgument)
	}
	_, err = retention.Prune(ctx, nil, retention.Config{})
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
}

// Run ends with its context's cause, and with pgbaton.ErrClosed once its
// client is closed.
func TestRunEnds(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c, err := leasetable.New(ctx, pool, leasetable.Config{})
	require.NoError(t, err)
	stop := errors.New("stop")
	rctx, cancel := context.WithCancelCause(ctx)
	done := make(chan error, 1)
	go func() { done <- retention.Run(rctx, c, retention.Config{Interval: time.Millisecond}) }()
	cancel(stop)
	require.ErrorIs(t, <-done, stop)

	go func() { done <- retention.Run(ctx, c, retention.Config{Interval: time.Millisecond}) }()
	require.NoError(t, c.Close(ctx))
	require.ErrorIs(t, <-done, pgbaton.ErrClosed)
	require.ErrorIs(t, retention.Run(ctx, c, retention.Config{}), pgbaton.ErrClosed)
}

// startRun runs retention.Run on a client of its own until stop is called
// or the test ends.
func startRun(t *testing.T, pool *pgxpool.Pool, owner string, cfg retention.Config) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	c, err := leasetable.New(ctx, pool, leasetable.Config{Owner: owner, Retention: leasetable.Retention{Disabled: true}})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- retention.Run(ctx, c, cfg) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			assert.ErrorIs(t, <-done, context.Canceled)
			assert.NoError(t, c.Close(context.Background()))
		})
	}
	t.Cleanup(stop)
	return stop
}

// A million cron slots and job runs written over 100 days: Run on one of
// two clients (the other waits for the retention lease) brings the
// tables down to their retention and keeps them there while new rows come
// in.
func TestRunKeepsTablesBounded(t *testing.T) {
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

	cfg := retention.Config{Interval: 200 * time.Millisecond, Batch: 10000}
	stopA := startRun(t, pool, "pruner-a", cfg)
	stopB := startRun(t, pool, "pruner-b", cfg)
	// The retention's share of the 100 days is what must be left.
	slotKept, runKept := rows*7/100, rows*30/100
	start = time.Now()
	var slots, runs int
	pgtest.Eventually(t, 5*time.Minute, func() (bool, error) {
		slots = pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.cron_slot")
		runs = pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.job_run")
		return slots <= slotKept+100 && runs <= runKept+100, nil
	}, "still cron slots and job runs above their retention")
	t.Logf("pruned down to %d cron slots (7 of 100 days: %d) and %d job runs (30 of 100 days: %d) in %s",
		slots, slotKept, runs, runKept, time.Since(start).Round(time.Millisecond))
	// Not too far either: what is younger than its retention stays.
	assert.GreaterOrEqual(t, slots, slotKept-100, "cron slots younger than 7 days were pruned")
	assert.GreaterOrEqual(t, runs, runKept-100, "job runs younger than 30 days were pruned")
	stopA()
	stopB()
	_, err = pool.Exec(ctx, "TRUNCATE pgbaton.cron_slot, pgbaton.job_run")
	require.NoError(t, err)

	// Steady state, time compressed: retention 2s, 5,000 new slots and
	// runs a second for 16s. The tables hold about 2s of them, not all 80k.
	short := retention.Config{Interval: 100 * time.Millisecond, Batch: 10000, CronSlots: 2 * time.Second, JobRuns: 2 * time.Second}
	startRun(t, pool, "pruner-c", short)
	const perTick, tick = 500, 100 * time.Millisecond
	// 2s of rows, plus up to 2s of lag for a pruner on a loaded machine.
	bound := int(4*time.Second/tick) * perTick
	peakSlots, peakRuns := 0, 0
	pace := time.NewTicker(tick) // the pace of new work
	defer pace.Stop()
	for i := range 160 {
		_, err := pool.Exec(ctx, `INSERT INTO pgbaton.cron_slot (job, scheduled_at, owner)
SELECT 'new-' || j, clock_timestamp() + ($1 * interval '1 microsecond'), 'o' FROM generate_series(1, $2) j`, i, perTick)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO pgbaton.job_run (job, owner, token, status, finished_at)
SELECT 'new-' || (j % 10), 'o', j, 'succeeded', clock_timestamp() FROM generate_series(1, $1) j`, perTick)
		require.NoError(t, err)
		if i >= 30 { // past the first retention period
			peakSlots = max(peakSlots, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.cron_slot"))
			peakRuns = max(peakRuns, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.job_run"))
		}
		<-pace.C
	}
	t.Logf("steady state, 5,000 rows/s at a 2s retention over 16s (80,000 written): at most %d cron slots and %d job runs (bound %d)",
		peakSlots, peakRuns, bound)
	assert.LessOrEqual(t, peakSlots, bound)
	assert.LessOrEqual(t, peakRuns, bound)
}
