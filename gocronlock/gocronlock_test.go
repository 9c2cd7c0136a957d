package gocronlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/gocronlock"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

func newClient(t *testing.T, pool *pgxpool.Pool, owner string) *leasetable.Client {
	t.Helper()
	c, err := leasetable.New(context.Background(), pool, leasetable.Config{Owner: owner, TTL: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return c
}

func newLocker(t *testing.T, client *leasetable.Client) *gocronlock.Locker {
	t.Helper()
	l, err := gocronlock.NewLocker(client, gocronlock.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close(context.Background())) })
	return l
}

// shutdown stops s when t ends.
func shutdown(t *testing.T, s gocron.Scheduler) {
	t.Cleanup(func() { require.NoError(t, s.Shutdown()) })
}

// everySecond is a cron job on every second. A new one for every job:
// gocron keeps the parsed schedule in the definition, so one definition
// shared by schedulers is a data race.
func everySecond() gocron.JobDefinition { return gocron.CronJob("* * * * * *", true) }

// Without the locker two schedulers run every tick: the tick tests can
// fail.
func TestWithoutLockerTicksRunTwice(t *testing.T) {
	counter := newSlotCounter(time.Second)
	for range 2 {
		s, err := gocron.NewScheduler(gocron.WithSchedulerMonitor(counter))
		require.NoError(t, err)
		_, err = s.NewJob(everySecond(), gocron.NewTask(func() {}), gocron.WithName("report"))
		require.NoError(t, err)
		s.Start()
		shutdown(t, s)
	}
	pgtest.Eventually(t, 15*time.Second, func() (bool, error) { return counter.span() >= 3, nil }, "3 ticks ran")
	_, _, _, doubled, _ := counter.tally()
	require.Positive(t, doubled)
}

// A run longer than the lease TTL keeps the job locked (the lease is
// renewed), slots that come while it runs are skipped on every scheduler
// rather than run alongside it, and the lease is free once it returns.
func TestLongRunNeverOverlaps(t *testing.T) {
	pool := env.DB(t).Pool(t)
	other := newClient(t, pool, "observer")
	var running, maxRunning, runs atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	job := func() {
		n := running.Add(1)
		defer running.Add(-1)
		for m := maxRunning.Load(); n > m && !maxRunning.CompareAndSwap(m, n); m = maxRunning.Load() {
		}
		if runs.Add(1) == 1 {
			started <- struct{}{}
			<-release
		}
	}
	for _, owner := range []string{"node-a", "node-b"} {
		s, err := newLocker(t, newClient(t, pool, owner)).NewScheduler()
		require.NoError(t, err)
		_, err = s.NewJob(everySecond(), gocron.NewTask(job), gocron.WithName("long"))
		require.NoError(t, err)
		s.Start()
		shutdown(t, s)
	}
	<-started
	deadline := time.Now().Add(3 * time.Second) // three TTLs, three slots
	for time.Now().Before(deadline) {
		_, err := other.TryAcquire(context.Background(), "gocron:long")
		require.ErrorIs(t, err, leasetable.ErrHeld)
		time.Sleep(200 * time.Millisecond) // time passing is what is tested
	}
	require.Equal(t, int32(1), runs.Load(), "no slot ran while the first run held the lease")
	close(release)
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) { return runs.Load() >= 3, nil }, "runs go on after the long one")
	require.Equal(t, int32(1), maxRunning.Load())
}

// RunNow runs the job at once, outside the schedule: it claims no slot,
// so the scheduled runs are not affected.
func TestRunNowClaimsNoSlot(t *testing.T) {
	pool := env.DB(t).Pool(t)
	s, err := newLocker(t, newClient(t, pool, "node-a")).NewScheduler()
	require.NoError(t, err)
	ran := make(chan struct{}, 1)
	j, err := s.NewJob(gocron.CronJob("0 0 1 1 *", false), gocron.NewTask(func() { ran <- struct{}{} }), gocron.WithName("yearly"))
	require.NoError(t, err)
	s.Start()
	shutdown(t, s)
	require.NoError(t, j.RunNow())
	<-ran
	var slots int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM pgbaton.cron_slot").Scan(&slots))
	require.Zero(t, slots)
}

// Setups the Locker cannot serve fail every run with a typed error:
// no scheduler bound, two jobs sharing a name.
func TestRefusedSetups(t *testing.T) {
	ctx := context.Background()
	pool := env.DB(t).Pool(t)
	client := newClient(t, pool, "node-a")

	_, err := newLocker(t, client).Lock(ctx, "report")
	require.ErrorIs(t, err, gocronlock.ErrNotBound)

	l := newLocker(t, client)
	s, err := l.NewScheduler()
	require.NoError(t, err)
	shutdown(t, s)
	for range 2 {
		_, err = s.NewJob(everySecond(), gocron.NewTask(func() {}), gocron.WithName("dup"))
		require.NoError(t, err)
	}
	_, err = l.Lock(ctx, "dup")
	require.ErrorIs(t, err, gocronlock.ErrDuplicateJobName)
	_, err = l.Lock(ctx, "missing")
	require.ErrorIs(t, err, gocron.ErrJobNotFound)
}

func TestCloseAndBind(t *testing.T) {
	ctx := context.Background()
	pool := env.DB(t).Pool(t)
	l := newLocker(t, newClient(t, pool, "node-a"))
	s, err := l.NewScheduler()
	require.NoError(t, err)
	shutdown(t, s)
	require.NoError(t, l.Bind(s), "binding the same scheduler again is a no-op")
	s2, err := gocron.NewScheduler()
	require.NoError(t, err)
	shutdown(t, s2)
	require.ErrorIs(t, l.Bind(s2), pgbaton.ErrInvalidArgument, "one Locker per scheduler")
	_, err = l.NewScheduler()
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, l.Bind(nil), pgbaton.ErrInvalidArgument)

	require.NoError(t, l.Close(ctx))
	_, err = l.Lock(ctx, "report")
	require.ErrorIs(t, err, pgbaton.ErrClosed)
	_, err = l.NewScheduler()
	require.ErrorIs(t, err, pgbaton.ErrClosed)
}

func TestElectorOneLeaderAndTakeover(t *testing.T) {
	ctx := context.Background()
	pool := env.DB(t).Pool(t)
	a, err := gocronlock.NewElector(newClient(t, pool, "node-a"), "scheduler-leader")
	require.NoError(t, err)
	b, err := gocronlock.NewElector(newClient(t, pool, "node-b"), "scheduler-leader")
	require.NoError(t, err)
	defer b.Close()

	var leader, follower *gocronlock.Elector
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		ea, eb := a.IsLeader(ctx), b.IsLeader(ctx)
		switch {
		case ea == nil && eb == nil:
			return false, errors.New("two leaders")
		case ea == nil:
			leader, follower = a, b
		case eb == nil:
			leader, follower = b, a
		}
		return leader != nil, nil
	}, "no leader elected")
	require.ErrorIs(t, follower.IsLeader(ctx), gocronlock.ErrNotLeader)

	leader.Close() // resigns
	require.ErrorIs(t, leader.IsLeader(ctx), gocronlock.ErrNotLeader)
	pgtest.Eventually(t, 5*time.Second, func() (bool, error) { return follower.IsLeader(ctx) == nil, nil }, "no takeover after the leader resigned")
	if leader != a {
		a.Close()
	}
}

func TestBadInput(t *testing.T) {
	_, err := gocronlock.NewLocker(nil, gocronlock.Config{})
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	pool := env.DB(t).Pool(t)
	c := newClient(t, pool, "node-a")
	_, err = gocronlock.NewElector(nil, "x")
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	_, err = gocronlock.NewElector(c, "")
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
}
