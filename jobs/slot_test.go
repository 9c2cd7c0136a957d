package jobs_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/jobs"
	"github.com/pgbaton/pgbaton/leasetable"
)

// childSlots tries ClaimSlot for args[1] slots starting at unix second
// args[2] of job "tick", with a skew of args[3] milliseconds added to its
// ticker, and prints "slot N" for each slot it won.
func childSlots(ctx context.Context, args []string) error {
	n, _ := strconv.Atoi(args[1])
	base, _ := strconv.ParseInt(args[2], 10, 64)
	skew, _ := strconv.Atoi(args[3])
	c, closeFn, err := childClient(ctx, args[0])
	if err != nil {
		return err
	}
	defer closeFn()
	for i := range n {
		// A skewed ticker fires at a different moment, but computes the
		// same nominal slot time.
		time.Sleep(time.Duration(skew) * time.Microsecond) // simulated skew, not synchronisation
		ok, err := jobs.ClaimSlot(ctx, c, "tick", time.Unix(base+int64(i)*60, 0))
		if err != nil {
			return err
		}
		if ok {
			pgtest.Printf("slot %d", i)
		}
	}
	pgtest.Printf("done")
	return nil
}

func TestClaimSlotOnceAcrossProcesses(t *testing.T) {
	d := env.DB(t)
	const slots, procs = 50, 3
	base := time.Now().Unix() / 60 * 60
	var kids []*pgtest.Child
	for p := range procs {
		kids = append(kids, env.StartChild(t, "slots", d.URL, strconv.Itoa(slots), strconv.FormatInt(base, 10), strconv.Itoa(p*300)))
	}
	won := map[string]int{}
	for _, k := range kids {
		for {
			line := k.Expect(t, "", 30*time.Second)
			if line == "done" {
				break
			}
			won[line]++
		}
		require.NoError(t, k.Wait(t, 10*time.Second))
	}
	require.Len(t, won, slots, "every slot ran")
	for s, n := range won {
		assert.Equal(t, 1, n, "%s ran %d times", s, n)
	}
	ok, err := leasetable.New(pgtest.Context(t, 10*time.Second), d.Pool(t), leasetable.Config{})
	require.NoError(t, err)
	defer ok.Close(context.Background())
	again, err := jobs.ClaimSlot(context.Background(), ok, "tick", time.Unix(base, 0).Add(123*time.Nanosecond))
	require.NoError(t, err)
	assert.False(t, again, "a slot is claimed once, to the microsecond")
}

// Bad input gets pgbaton.ErrInvalidArgument and writes nothing.
func TestBadInput(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	c := newClient(t, pool, leasetable.Config{})
	for _, name := range []string{"", strings.Repeat("n", 256), "a\x00", "\xff\xfe"} {
		_, err := jobs.ClaimSlot(ctx, c, name, time.Now())
		assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%q", name)
		assert.ErrorIs(t, jobs.Do(ctx, c, name, func(context.Context, *jobs.Run) error { return nil }), pgbaton.ErrInvalidArgument)
		_, err = jobs.Runs(ctx, c, name, 1)
		assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%q", name)
	}
	_, err := jobs.ClaimSlot(ctx, c, "job", time.Time{})
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	assert.ErrorIs(t, jobs.Do(ctx, c, "x", nil), pgbaton.ErrInvalidArgument)
	_, err = jobs.Runs(ctx, c, "x", 0)
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	// Nothing was written by any of it.
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM pgbaton.lease) + (SELECT count(*) FROM pgbaton.job_run) + (SELECT count(*) FROM pgbaton.cron_slot)").Scan(&n))
	assert.Zero(t, n)

	// A closed client.
	require.NoError(t, c.Close(ctx))
	_, err = jobs.ClaimSlot(ctx, c, "job", time.Now())
	assert.ErrorIs(t, err, pgbaton.ErrClosed)
	assert.ErrorIs(t, jobs.Do(ctx, c, "job", func(context.Context, *jobs.Run) error { return nil }), pgbaton.ErrClosed)
	_, err = jobs.Runs(ctx, c, "job", 1)
	assert.ErrorIs(t, err, pgbaton.ErrClosed)
}
