package jobs

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/leasetable"
)

// Run is one run of a job under the job's lease, recorded in
// pgbaton.job_run.
type Run struct {
	c     *leasetable.Client
	pool  *pgxpool.Pool
	q     *db.Queries
	id    int64
	job   string
	lease *leasetable.Lease

	mu         sync.Mutex
	checkpoint []byte
}

// ID is the run's id in pgbaton.job_run.
func (r *Run) ID() int64 { return r.id }

// Job is the job's name, which is also its lease's name.
func (r *Run) Job() string { return r.job }

// Token is the run's fencing token: the job lease's token.
func (r *Run) Token() int64 { return r.lease.Token() }

// Lease is the job's lease, held for the whole run.
func (r *Run) Lease() *leasetable.Lease { return r.lease }

// Do acquires the job's lease through c (waiting like Client.Acquire),
// records a run in pgbaton.job_run, runs fn and records how it ended:
// succeeded (fn returned nil), cancelled (ctx ended), failed (fn's error,
// stored), or lost (the lease was lost; fn's context is cancelled with
// cause leasetable.ErrLeaseLost). Runs of the job a lost holder left
// marked started are marked lost. The run's heartbeat_at moves with every
// keep-alive of the lease. It returns fn's error; a loss of the lease
// while fn ran is always in the error (wrapping leasetable.ErrLeaseLost),
// joined with fn's when fn failed too.
func Do(ctx context.Context, c *leasetable.Client, job string, fn func(ctx context.Context, r *Run) error) error {
	if err := checkJob(job); err != nil {
		return err
	}
	if len(job) > MaxNameLen {
		return invalid("job name is %d bytes, at most %d allowed (its checkpoint key %q+name must fit in %d)",
			len(job), MaxNameLen, CheckpointKeyPrefix, leasetable.MaxNameLen)
	}
	if fn == nil {
		return invalid("nil function")
	}
	pool, err := c.Pool()
	if err != nil {
		return err
	}
	l, err := c.Acquire(ctx, job)
	if err != nil {
		return err
	}
	r := &Run{c: c, pool: pool, q: db.New(), job: job, lease: l}
	if err := r.start(ctx); err != nil {
		_ = l.Release(ctx)
		return err
	}
	log := c.Config().Logger
	l.OnRenew(func(ctx context.Context) {
		if err := r.q.JobRunHeartbeat(ctx, pool, r.id); err != nil {
			log.Debug("pgbaton: job run heartbeat failed", "job", job, "run", r.id, "error", err)
		}
	})
	var fnErr error
	err = l.Do(ctx, func(fnCtx context.Context) error {
		fnErr = fn(fnCtx, r)
		// Record the outcome while the lease is still held, so the status
		// write is fenced like a checkpoint.
		return r.finish(ctx, fnErr)
	})
	// As leasetable.Do: a loss while fn ran is always in the error,
	// joined with fn's when fn failed too.
	switch {
	case fnErr == nil:
		return err
	case err == nil || errors.Is(err, fnErr):
		return fnErr
	case errors.Is(err, leasetable.ErrLeaseLost):
		return errors.Join(fnErr, err)
	}
	return fnErr
}

// start records the run and reads the checkpoint a previous unfinished
// run left. The lease keeps others from writing it meanwhile.
func (r *Run) start(ctx context.Context) error {
	row, err := r.q.JobRunStart(ctx, r.pool, db.JobRunStartParams{Job: r.job, Owner: r.c.Owner(), Token: r.lease.Token()})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: job %q: lease lost before the run was recorded", leasetable.ErrLeaseLost, r.job)
	}
	if err != nil {
		return dbError("start run of "+r.job, err)
	}
	r.id = row.ID
	v, err := fencedwrite.GetValue(ctx, r.pool, CheckpointKey(r.job))
	switch {
	case errors.Is(err, fencedwrite.ErrNotFound):
	case err != nil:
		return dbError("read checkpoint of "+r.job, err)
	default:
		r.checkpoint = v.Data
	}
	return nil
}

// finish records the run's end. ctx is the caller's: its end tells a
// cancelled caller from a lost lease.
func (r *Run) finish(ctx context.Context, fnErr error) error {
	status := Succeeded
	var msg pgtype.Text
	switch {
	case r.lease.Err() != nil && errors.Is(r.lease.Err(), leasetable.ErrLeaseLost):
		status = Lost
	case fnErr != nil && ctx.Err() != nil:
		status = Cancelled
	case fnErr != nil:
		status = Failed
	}
	if fnErr != nil {
		msg = pgtype.Text{String: fnErr.Error(), Valid: true}
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.c.Config().TTL)
	defer cancel()
	token := r.lease.Token()
	p := db.JobRunFinishParams{Status: status, Error: msg, ID: r.id, Job: r.job, Owner: r.c.Owner(), Token: token}
	var err error
	if status == Succeeded {
		// The job is done: the next run starts afresh. Fenced like the
		// status write, in the same transaction.
		err = pgx.BeginFunc(wctx, r.pool, func(tx pgx.Tx) error {
			if _, err := r.q.JobRunFinish(wctx, tx, p); err != nil {
				return err
			}
			err := fencedwrite.DeleteValue(wctx, tx, CheckpointKey(r.job), token)
			if errors.Is(err, fencedwrite.ErrNotFound) {
				return nil
			}
			return err
		})
	} else {
		_, err = r.q.JobRunFinish(wctx, r.pool, p)
	}
	if (errors.Is(err, pgx.ErrNoRows) || errors.Is(err, fencedwrite.ErrStaleToken)) && status != Lost {
		// The lease was lost between fn's return and this write.
		p.Status = Lost
		_, err = r.q.JobRunFinish(wctx, r.pool, p)
		if err == nil || errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: job %q run %d", leasetable.ErrLeaseLost, r.job, r.id)
		}
	}
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil // marked lost already by the holder that took over
	}
	if err != nil {
		return dbError("finish run of "+r.job, err)
	}
	if status == Lost {
		return fmt.Errorf("%w: job %q run %d", leasetable.ErrLeaseLost, r.job, r.id)
	}
	return nil
}
