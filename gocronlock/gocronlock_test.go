package gocronlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/gocronlock"
	"github.com/pgbaton/pgbaton/internal/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

func newClient(t *testing.T, pool *pgxpool.Pool, owner string) *leasetable.Client {
	t.Helper()
	c, err := leasetable.New(context.Background(), pool, leasetable.Config{Owner: owner, TTL: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return c
}

// ticks counts job runs per cron tick (the second it belongs to).
type ticks struct {
	mu sync.Mutex
	n  map[time.Time]int
}

func (tk *ticks) run() {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	tk.n[time.Now().Truncate(time.Second)]++
}

func (tk *ticks) snapshot() map[time.Time]int {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	out := make(map[time.Time]int, len(tk.n))
	for k, v := range tk.n {
		out[k] = v
	}
	return out
}

func startScheduler(t *testing.T, opt gocron.SchedulerOption, tk *ticks) gocron.Scheduler {
	t.Helper()
	s, err := gocron.NewScheduler(opt)
	require.NoError(t, err)
	_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(tk.run), gocron.WithName("report"))
	require.NoError(t, err)
	s.Start()
	return s
}

// Two schedulers tick every second; each tick runs the job once.
func TestTwoSchedulersRunEachTickOnce(t *testing.T) {
	pool := env.DB(t).Pool(t)
	tk := &ticks{n: map[time.Time]int{}}
	var schedulers []gocron.Scheduler
	var lockers []*gocronlock.Locker
	for _, owner := range []string{"node-a", "node-b"} {
		locker, err := gocronlock.NewLocker(newClient(t, pool, owner), gocronlock.Config{MinHold: 500 * time.Millisecond})
		require.NoError(t, err)
		lockers = append(lockers, locker)
		schedulers = append(schedulers, startScheduler(t, gocron.WithDistributedLocker(locker), tk))
	}
	pgtest.Eventually(t, 15*time.Second, func() (bool, error) { return len(tk.snapshot()) >= 4, nil }, "fewer than 4 ticks ran")
	for _, s := range schedulers {
		require.NoError(t, s.Shutdown())
	}
	for _, l := range lockers {
		require.NoError(t, l.Close(context.Background()))
	}
	for tick, n := range tk.snapshot() {
		require.Equal(t, 1, n, "tick %s ran %d times", tick.Format(time.TimeOnly), n)
	}
}

// Without the locker both schedulers run every tick: the test can fail.
func TestWithoutLockerEveryTickRunsTwice(t *testing.T) {
	tk := &ticks{n: map[time.Time]int{}}
	a := startScheduler(t, gocron.WithLocation(time.UTC), tk)
	b := startScheduler(t, gocron.WithLocation(time.UTC), tk)
	pgtest.Eventually(t, 15*time.Second, func() (bool, error) {
		for _, n := range tk.snapshot() {
			if n >= 2 {
				return true, nil
			}
		}
		return false, nil
	}, "no tick ran twice without a locker")
	require.NoError(t, a.Shutdown())
	require.NoError(t, b.Shutdown())
}

// A run longer than the lease TTL keeps its lock: the lease is renewed.
func TestLongRunStaysLocked(t *testing.T) {
	ctx := context.Background()
	pool := env.DB(t).Pool(t)
	locker, err := gocronlock.NewLocker(newClient(t, pool, "node-a"), gocronlock.Config{})
	require.NoError(t, err)
	defer locker.Close(ctx)
	other := newClient(t, pool, "node-b")

	lock, err := locker.Lock(ctx, "long-job")
	require.NoError(t, err)
	deadline := time.Now().Add(3 * time.Second) // three TTLs
	for time.Now().Before(deadline) {
		_, err := other.TryAcquire(ctx, "gocron:long-job")
		require.ErrorIs(t, err, leasetable.ErrHeld)
		time.Sleep(200 * time.Millisecond) // time passing is what is tested
	}
	require.NoError(t, lock.Unlock(ctx))
	// Unlocked after MinHold passed: free at once.
	l, err := other.TryAcquire(ctx, "gocron:long-job")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
}

// A short run keeps the lock for MinHold, then frees it; Close frees it at
// once.
func TestMinHoldAndClose(t *testing.T) {
	ctx := context.Background()
	pool := env.DB(t).Pool(t)
	locker, err := gocronlock.NewLocker(newClient(t, pool, "node-a"), gocronlock.Config{MinHold: time.Minute})
	require.NoError(t, err)
	other := newClient(t, pool, "node-b")

	lock, err := locker.Lock(ctx, "short-job")
	require.NoError(t, err)
	require.NoError(t, lock.Unlock(ctx))
	_, err = other.TryAcquire(ctx, "gocron:short-job")
	require.ErrorIs(t, err, leasetable.ErrHeld, "kept for MinHold after Unlock")

	_, err = locker.Lock(ctx, "short-job")
	require.ErrorIs(t, err, leasetable.ErrHeld, "a second run of the same job is refused")

	require.NoError(t, locker.Close(ctx))
	l, err := other.TryAcquire(ctx, "gocron:short-job")
	require.NoError(t, err, "Close released the kept lease")
	require.NoError(t, l.Release(ctx))
	_, err = locker.Lock(ctx, "short-job")
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
	_, err = gocronlock.NewLocker(c, gocronlock.Config{MinHold: -time.Second})
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	_, err = gocronlock.NewElector(nil, "x")
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	_, err = gocronlock.NewElector(c, "")
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
}
