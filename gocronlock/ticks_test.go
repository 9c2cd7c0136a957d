package gocronlock_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/gocronlock"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// slotCounter is a gocron.SchedulerMonitor that counts the runs of each
// scheduled slot, as gocron itself names it: the scheduled time it passes
// to JobSchedulingDelay for every run that got past the locker. Counting by
// the scheduled time rather than by the clock when the job runs keeps the
// count right on a loaded machine, where a run may start late.
type slotCounter struct {
	cell time.Duration // slots are counted per cell of this length

	mu   sync.Mutex
	runs map[time.Time]int
}

func newSlotCounter(cell time.Duration) *slotCounter {
	return &slotCounter{cell: cell, runs: map[time.Time]int{}}
}

func (c *slotCounter) JobSchedulingDelay(_ gocron.Job, scheduled, _ time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runs[scheduled.Truncate(c.cell)]++
}

func (*slotCounter) SchedulerStarted()                          {}
func (*slotCounter) SchedulerStopped()                          {}
func (*slotCounter) SchedulerShutdown()                         {}
func (*slotCounter) JobRegistered(gocron.Job)                   {}
func (*slotCounter) JobUnregistered(gocron.Job)                 {}
func (*slotCounter) JobStarted(gocron.Job)                      {}
func (*slotCounter) JobRunning(gocron.Job)                      {}
func (*slotCounter) JobFailed(gocron.Job, error)                {}
func (*slotCounter) JobCompleted(gocron.Job)                    {}
func (*slotCounter) JobExecutionTime(gocron.Job, time.Duration) {}
func (*slotCounter) ConcurrencyLimitReached(string, gocron.Job) {}

// span is the number of cells from the first counted slot to the last.
func (c *slotCounter) span() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first, last time.Time
	for s := range c.runs {
		if first.IsZero() || s.Before(first) {
			first = s
		}
		if s.After(last) {
			last = s
		}
	}
	if first.IsZero() {
		return 0
	}
	return int(last.Sub(first) / c.cell)
}

// tally counts, over the slots strictly between the first and the last
// counted one (the schedulers start and stop around those), the slots
// that ran once, not at all, and more than once.
func (c *slotCounter) tally() (ticks, once, missed, doubled int, detail string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var slots []time.Time
	for s := range c.runs {
		slots = append(slots, s)
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i].Before(slots[j]) })
	for s := slots[0].Add(c.cell); s.Before(slots[len(slots)-1]); s = s.Add(c.cell) {
		ticks++
		switch n := c.runs[s]; {
		case n == 1:
			once++
		case n == 0:
			missed++
			detail += fmt.Sprintf(" %s:0", s.Format("15:04:05.000"))
		default:
			doubled++
			detail += fmt.Sprintf(" %s:%d", s.Format("15:04:05.000"), n)
		}
	}
	return ticks, once, missed, doubled, detail
}

// runSchedulers runs the job on three schedulers, each with its own client
// and a Locker with the default Config, until slots spanning more than 32
// cells ran, and returns the count.
func runSchedulers(t *testing.T, def func() gocron.JobDefinition, opts func(node int) []gocron.JobOption, cell time.Duration) *slotCounter {
	pool := env.DB(t).Pool(t)
	counter := newSlotCounter(cell)
	var schedulers []gocron.Scheduler
	var lockers []*gocronlock.Locker
	for node := range 3 {
		client, err := leasetable.New(context.Background(), pool, leasetable.Config{Owner: fmt.Sprintf("node-%d", node)})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, client.Close(context.Background())) })
		locker, err := gocronlock.NewLocker(client, gocronlock.Config{})
		require.NoError(t, err)
		lockers = append(lockers, locker)
		s, err := locker.NewScheduler(gocron.WithSchedulerMonitor(counter))
		require.NoError(t, err)
		_, err = s.NewJob(def(), gocron.NewTask(func() {}), append(opts(node), gocron.WithName("report"))...)
		require.NoError(t, err)
		schedulers = append(schedulers, s)
	}
	for _, s := range schedulers {
		s.Start()
	}
	pgtest.Eventually(t, 2*time.Minute, func() (bool, error) { return counter.span() > 32, nil },
		"slots spanning 32 cells ran")
	for _, s := range schedulers {
		require.NoError(t, s.Shutdown())
	}
	for _, l := range lockers {
		require.NoError(t, l.Close(context.Background()))
	}
	return counter
}

func requireEachTickOnce(t *testing.T, c *slotCounter) {
	t.Helper()
	ticks, once, missed, doubled, detail := c.tally()
	t.Logf("%d ticks: %d ran once, %d missed, %d doubled%s", ticks, once, missed, doubled, detail)
	require.GreaterOrEqual(t, ticks, 30)
	require.Equal(t, ticks, once, "every tick runs exactly once:%s", detail)
}

// Three schedulers run an every-second cron job with the default Config:
// every tick runs exactly once across them.
func TestThreeSchedulersCronEachTickOnce(t *testing.T) {
	t.Parallel()
	c := runSchedulers(t, everySecond, func(int) []gocron.JobOption { return nil }, time.Second)
	requireEachTickOnce(t, c)
}

// Three schedulers run a job every second, started at different moments
// within a second (as nodes start): every one-second interval runs the job
// exactly once across them.
func TestThreeSchedulersDurationEachTickOnce(t *testing.T) {
	t.Parallel()
	// Far enough ahead that the last node's start is still in the future
	// when its job is made, after three clients were set up on a busy
	// machine (gocron refuses a start in the past).
	base := time.Now().Truncate(time.Second).Add(5 * time.Second)
	c := runSchedulers(t, func() gocron.JobDefinition { return gocron.DurationJob(time.Second) }, func(node int) []gocron.JobOption {
		// Phases 0.1s, 0.4s and 0.7s into the second.
		at := base.Add(time.Duration(100+300*node) * time.Millisecond)
		return []gocron.JobOption{gocron.WithStartAt(gocron.WithStartDateTime(at))}
	}, time.Second)
	requireEachTickOnce(t, c)
}
