package jobs_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/jobs"
	"github.com/pgbaton/pgbaton/leasetable"
)

type progress struct{ Done int }

// childJob runs job "etl", checkpointing progress 1, 2, 3, ... and printing
// "checkpoint N" after each, until killed.
func childJob(ctx context.Context, args []string) error {
	c, closeFn, err := childClient(ctx, args[0])
	if err != nil {
		return err
	}
	defer closeFn()
	return jobs.Do(ctx, c, "etl", func(ctx context.Context, r *jobs.Run) error {
		for i := 1; ; i++ {
			if err := r.Checkpoint(ctx, progress{Done: i}); err != nil {
				return err
			}
			pgtest.Printf("checkpoint %d", i)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond): // the job's own work
			}
		}
	})
}

func TestDoResumesAfterKilledHolder(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	k := env.StartChild(t, "job", d.URL)
	for k.Expect(t, "checkpoint", 30*time.Second) != "3" {
	}
	k.Signal(t, syscall.SIGSTOP) // freeze it: its last checkpoint is at least 3
	k.Signal(t, syscall.SIGKILL)
	c := newClient(t, pool, leasetable.Config{Owner: "resumer", TTL: shortTTL})
	var resumed progress
	err := jobs.Do(ctx, c, "etl", func(ctx context.Context, r *jobs.Run) error {
		ok, err := r.LastCheckpoint(&resumed)
		require.NoError(t, err)
		require.True(t, ok, "a new holder sees the lost run's checkpoint")
		return r.Checkpoint(ctx, progress{Done: resumed.Done + 1})
	})
	require.NoError(t, err)
	assert.GreaterOrEqual(t, resumed.Done, 3)

	runs, err := jobs.Runs(ctx, c, "etl", 10)
	require.NoError(t, err)
	require.Len(t, runs, 2)
	assert.Equal(t, jobs.Succeeded, runs[0].Status)
	assert.Equal(t, "resumer", runs[0].Owner)
	assert.JSONEq(t, `{"Done":`+strconv.Itoa(resumed.Done+1)+`}`, string(runs[0].Checkpoint))
	assert.Equal(t, jobs.Lost, runs[1].Status, "the killed run is marked lost")
	assert.NotNil(t, runs[1].FinishedAt)
	assert.Greater(t, runs[0].Token, runs[1].Token)

	// A later run starts fresh: the last run succeeded.
	require.NoError(t, jobs.Do(ctx, c, "etl", func(ctx context.Context, r *jobs.Run) error {
		var p progress
		ok, err := r.LastCheckpoint(&p)
		assert.False(t, ok)
		return err
	}))
}

func TestDoLostLeaseFencesCheckpoint(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "slow", TTL: 500 * time.Millisecond})
	err := jobs.Do(ctx, c, "fenced", func(fnCtx context.Context, r *jobs.Run) error {
		require.NoError(t, r.Checkpoint(fnCtx, progress{Done: 1}))
		// Renewals are blocked until the grant expires; then another
		// holder takes over.
		unblock := pgtest.BlockKeepalives(t, pool, "slow")
		<-fnCtx.Done()
		assert.ErrorIs(t, context.Cause(fnCtx), leasetable.ErrLeaseLost)
		unblock()
		thief := newClient(t, pool, leasetable.Config{Owner: "thief"})
		tl, err := thief.Acquire(ctx, "fenced")
		require.NoError(t, err)
		assert.Greater(t, tl.Token(), r.Token())
		// The stale run can no longer write progress.
		err = r.Checkpoint(ctx, progress{Done: 2})
		require.ErrorIs(t, err, leasetable.ErrLeaseLost)
		return context.Cause(fnCtx)
	})
	require.ErrorIs(t, err, leasetable.ErrLeaseLost)
	runs, err := jobs.Runs(ctx, c, "fenced", 1)
	require.NoError(t, err)
	assert.Equal(t, jobs.Lost, runs[0].Status)
	assert.JSONEq(t, `{"Done":1}`, string(runs[0].Checkpoint))
}

func TestDoStatuses(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{TTL: shortTTL})
	boom := errors.New("boom")
	require.ErrorIs(t, jobs.Do(ctx, c, "j", func(context.Context, *jobs.Run) error { return boom }), boom)
	cctx, cancel := context.WithCancel(ctx)
	err := jobs.Do(cctx, c, "j", func(ctx context.Context, r *jobs.Run) error {
		// Heartbeats move with renewals while the run lasts.
		first := heartbeat(t, pool, r.ID())
		pgtest.Eventually(t, 5*time.Second, func() (bool, error) {
			return heartbeat(t, pool, r.ID()).After(first), nil
		}, "heartbeat did not move")
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	runs, err := jobs.Runs(ctx, c, "j", 10)
	require.NoError(t, err)
	require.Len(t, runs, 2)
	assert.Equal(t, jobs.Cancelled, runs[0].Status)
	assert.Equal(t, jobs.Failed, runs[1].Status)
	assert.Equal(t, "boom", runs[1].Error)
	in, err := c.Info(ctx, "j")
	require.NoError(t, err)
	assert.False(t, in.Held, "the job's lease is released after every run")
}

func heartbeat(t *testing.T, pool *pgxpool.Pool, id int64) time.Time {
	t.Helper()
	var hb time.Time
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT heartbeat_at FROM pgbaton.job_run WHERE id = $1", id).Scan(&hb))
	return hb
}

func TestCheckpointFencedInDatabase(t *testing.T) {
	// The holder has not noticed yet (long renew interval), but its grant
	// was taken over: the database refuses the checkpoint.
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "unaware", TTL: time.Minute})
	err := jobs.Do(ctx, c, "db-fenced", func(ctx context.Context, r *jobs.Run) error {
		require.NoError(t, r.Checkpoint(ctx, progress{Done: 1}))
		_, err := pool.Exec(ctx, "UPDATE pgbaton.lease SET owner = 'thief', token = nextval('pgbaton.lease_token_seq') WHERE name = 'db-fenced'")
		require.NoError(t, err)
		require.NoError(t, r.Lease().Err(), "not noticed locally yet")
		err = r.Checkpoint(ctx, progress{Done: 2})
		require.ErrorIs(t, err, leasetable.ErrLeaseLost)
		return nil
	})
	require.ErrorIs(t, err, leasetable.ErrLeaseLost, "fn returned nil, but the lease was lost")
	runs, err := jobs.Runs(ctx, c, "db-fenced", 1)
	require.NoError(t, err)
	assert.Equal(t, jobs.Lost, runs[0].Status)
	assert.JSONEq(t, `{"Done":1}`, string(runs[0].Checkpoint))
}

func TestCheckpointInFencedValue(t *testing.T) {
	// A holder that has not noticed its loss (long TTL) keeps running
	// while a new holder resumes from its checkpoint; the stale holder's
	// next checkpoint is refused by the fenced value.
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	key := jobs.CheckpointKey("ck")
	stale := newClient(t, pool, leasetable.Config{Owner: "stale", TTL: time.Minute})
	fresh := newClient(t, pool, leasetable.Config{Owner: "fresh", TTL: time.Minute})

	staleRun := make(chan *jobs.Run)
	finished := make(chan struct{})
	staleErr := make(chan error, 1)
	go func() {
		staleErr <- jobs.Do(ctx, stale, "ck", func(ctx context.Context, r *jobs.Run) error {
			if err := r.Checkpoint(ctx, progress{Done: 1}); err != nil {
				return err
			}
			staleRun <- r
			<-finished
			return nil
		})
	}()
	rs := <-staleRun
	v, err := fencedwrite.GetValue(ctx, pool, key)
	require.NoError(t, err)
	assert.Equal(t, rs.Token(), v.Token)
	assert.JSONEq(t, `{"Done":1}`, string(v.Data))

	// The grant and its session expire by the database clock; the holder
	// does not know (its own deadline is a minute away).
	_, err = pool.Exec(ctx, `UPDATE pgbaton.lease SET expires_at = clock_timestamp() WHERE name = 'ck';
UPDATE pgbaton.lease_session SET expires_at = clock_timestamp(), expires_floor = clock_timestamp() WHERE owner = 'stale'`)
	require.NoError(t, err)
	stop := errors.New("stop before done")
	err = jobs.Do(ctx, fresh, "ck", func(ctx context.Context, r *jobs.Run) error {
		var p progress
		ok, err := r.LastCheckpoint(&p)
		require.NoError(t, err)
		require.True(t, ok, "resumes from the fenced value")
		assert.Equal(t, 1, p.Done)
		require.NoError(t, r.Checkpoint(ctx, progress{Done: 2}))

		err = rs.Checkpoint(ctx, progress{Done: 99})
		require.ErrorIs(t, err, fencedwrite.ErrStaleToken)
		require.ErrorIs(t, err, leasetable.ErrLeaseLost)
		var stErr *fencedwrite.StaleTokenError
		require.ErrorAs(t, err, &stErr)
		assert.Equal(t, rs.Token(), stErr.Presented)
		// Writing the value directly with the old token is refused too.
		_, err = fencedwrite.PutValue(ctx, pool, key, rs.Token(), []byte(`{"Done":99}`))
		require.ErrorIs(t, err, fencedwrite.ErrStaleToken)
		v, err := fencedwrite.GetValue(ctx, pool, key)
		require.NoError(t, err)
		assert.Equal(t, r.Token(), v.Token)
		assert.JSONEq(t, `{"Done":2}`, string(v.Data))
		return stop
	})
	require.ErrorIs(t, err, stop)
	close(finished)
	require.ErrorIs(t, <-staleErr, leasetable.ErrLeaseLost)

	runs, err := jobs.Runs(ctx, fresh, "ck", 10)
	require.NoError(t, err)
	require.Len(t, runs, 2)
	assert.Equal(t, jobs.Failed, runs[0].Status)
	assert.JSONEq(t, `{"Done":2}`, string(runs[0].Checkpoint), "job_run keeps a copy for `pgbaton runs`")
	assert.Equal(t, jobs.Lost, runs[1].Status)
	assert.JSONEq(t, `{"Done":1}`, string(runs[1].Checkpoint))

	// The failed run's checkpoint carries over; a success deletes it.
	require.NoError(t, jobs.Do(ctx, fresh, "ck", func(ctx context.Context, r *jobs.Run) error {
		var p progress
		ok, err := r.LastCheckpoint(&p)
		require.True(t, ok)
		assert.Equal(t, 2, p.Done)
		return err
	}))
	_, err = fencedwrite.GetValue(ctx, pool, key)
	require.ErrorIs(t, err, fencedwrite.ErrNotFound)

	long := strings.Repeat("j", jobs.MaxNameLen+1)
	require.ErrorIs(t, jobs.Do(ctx, fresh, long, func(context.Context, *jobs.Run) error { return nil }), pgbaton.ErrInvalidArgument)
	in, err := fresh.Info(ctx, long)
	require.NoError(t, err)
	assert.Zero(t, in.Token, "nothing taken")
}
