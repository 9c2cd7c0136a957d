package advisory_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/jobs"
	"github.com/pgbaton/pgbaton/leasetable"
)

// What the package documentation says about cron jobs. Three nodes tick
// for the same 15 slots, each after the one before has finished its run,
// as tickers a little apart do when a run is shorter than the skew. A
// skip-if-held lock finds the key free every time and runs each slot
// three times; claiming the slot first runs each exactly once.
func TestCronSkipIfHeldDoesNotDedupeSlots(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	const nodes, slots = 3, 15
	var lockers []*advisory.Locker
	var clients []*leasetable.Client
	for range nodes {
		lockers = append(lockers, newLocker(t, pool, advisory.Config{}))
		c, err := leasetable.New(ctx, pool, leasetable.Config{})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
		clients = append(clients, c)
	}
	start := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	count := func(claim bool) map[time.Time]int {
		runs := map[time.Time]int{}
		for s := range slots {
			slot := start.Add(time.Duration(s) * time.Second)
			for n := range nodes {
				if claim {
					won, err := jobs.ClaimSlot(ctx, clients[n], "report", slot)
					require.NoError(t, err)
					if !won {
						continue
					}
				}
				err := lockers[n].RunExclusive(ctx, advisory.Name("job:report"), func(context.Context) error {
					runs[slot]++
					return nil
				}, advisory.RunOptions{})
				require.NoError(t, err, "the lock is free: the run before has ended")
			}
		}
		return runs
	}

	runs := count(false)
	require.Len(t, runs, slots)
	for slot, n := range runs {
		require.Equal(t, nodes, n, "skip-if-held: slot %s runs on every node", slot.Format(time.TimeOnly))
	}
	runs = count(true)
	require.Len(t, runs, slots)
	for slot, n := range runs {
		require.Equal(t, 1, n, "ClaimSlot: slot %s runs once", slot.Format(time.TimeOnly))
	}
}
