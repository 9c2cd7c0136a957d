package leasetable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/db"
)

// Run statuses stored in pgbaton.job_run.status.
const (
	RunStarted   = "started"
	RunSucceeded = "succeeded"
	RunFailed    = "failed"
	RunCancelled = "cancelled"
	RunLost      = "lost"
)

// Run is one run of a job under the job's lease, recorded in
// pgbaton.job_run.
type Run struct {
	c     *Client
	id    int64
	job   string
	lease *Lease

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
func (r *Run) Lease() *Lease { return r.lease }

// CheckpointKeyPrefix starts the pgbaton.fenced_value key of a job's
// checkpoint: the key is the prefix and the job's name.
const CheckpointKeyPrefix = "job:"

// MaxJobNameLen is the longest job name RunJob accepts, in bytes: its
// checkpoint key must fit in MaxNameLen.
const MaxJobNameLen = MaxNameLen - len(CheckpointKeyPrefix)

// CheckpointKey is the pgbaton.fenced_value key under which runs of job
// keep their checkpoint, for fencedwrite.GetValue and tools.
func CheckpointKey(job string) string { return CheckpointKeyPrefix + job }

// Checkpoint stores state (as JSON) as the run's progress, only while the
// run's lease is still valid. In one transaction it guards the lease
// (fencedwrite.Guard: this token, not expired, row locked FOR SHARE until
// commit), writes the fenced value CheckpointKey(job) with the run's token
// (fencedwrite.PutValue: refused if a newer token wrote it) and copies it
// to pgbaton.job_run.checkpoint for `pgbaton runs`. After a loss it
// returns an error wrapping both ErrLeaseLost and fencedwrite.ErrStaleToken
// and stores nothing, so a stale run can never overwrite the progress of
// the run that took over.
func (r *Run) Checkpoint(ctx context.Context, state any) error {
	if err := r.lease.Err(); err != nil {
		return fmt.Errorf("checkpoint of job %q: %w", r.job, err)
	}
	b, err := json.Marshal(state)
	if err != nil {
		return invalid("checkpoint state: %v", err)
	}
	err = pgx.BeginFunc(ctx, r.c.pool, func(tx pgx.Tx) error {
		if err := fencedwrite.Guard(ctx, tx, r.job, r.lease.token); err != nil {
			return err
		}
		if _, err := fencedwrite.PutValue(ctx, tx, CheckpointKey(r.job), r.lease.token, b); err != nil {
			return err
		}
		_, err := r.c.q.JobRunCheckpoint(ctx, tx, db.JobRunCheckpointParams{
			Checkpoint: b, ID: r.id, Token: r.lease.token, Job: r.job, Owner: r.c.cfg.Owner,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			// The guard passed, so the run was finished, not taken over.
			return fmt.Errorf("%w: run %d of job %q is no longer running", ErrNotHeld, r.id, r.job)
		}
		return err
	})
	switch {
	case errors.Is(err, fencedwrite.ErrStaleToken):
		return fmt.Errorf("%w: checkpoint of job %q refused: %w", ErrLeaseLost, r.job, err)
	case errors.Is(err, ErrNotHeld):
		return err
	case err != nil:
		return r.c.dbError("checkpoint "+r.job, err)
	}
	r.mu.Lock()
	r.checkpoint = b
	r.mu.Unlock()
	return nil
}

// LastCheckpoint decodes the latest checkpoint into v: this run's own, or
// else the one a previous unfinished run (lost, failed, cancelled) of the
// job left in pgbaton.fenced_value, read when this run started, so the run
// resumes where that one stopped. A run that succeeds deletes the
// checkpoint. It reports false, leaving v alone, when there is none.
func (r *Run) LastCheckpoint(v any) (bool, error) {
	r.mu.Lock()
	b := r.checkpoint
	r.mu.Unlock()
	if b == nil {
		return false, nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("leasetable: decode checkpoint of job %q: %w", r.job, err)
	}
	return true, nil
}

// RunJob acquires the job's lease (waiting like Acquire), records a run in
// pgbaton.job_run, runs fn and records how it ended: succeeded (fn returned
// nil), cancelled (ctx ended), failed (fn's error, stored), or lost (the
// lease was lost; fn's context is cancelled with cause ErrLeaseLost).
// Runs of the job a lost holder left marked started are marked lost. The
// run's heartbeat_at moves with every lease renewal. It returns fn's
// error, or an error wrapping ErrLeaseLost.
func (c *Client) RunJob(ctx context.Context, job string, fn func(ctx context.Context, r *Run) error) error {
	if err := checkName("job name", job); err != nil {
		return err
	}
	if len(job) > MaxJobNameLen {
		return invalid("job name is %d bytes, at most %d allowed (its checkpoint key %q+name must fit in %d)",
			len(job), MaxJobNameLen, CheckpointKeyPrefix, MaxNameLen)
	}
	if fn == nil {
		return invalid("nil function")
	}
	l, err := c.acquire(ctx, job, nil)
	if err != nil {
		return err
	}
	r, err := c.startRun(ctx, job, l)
	if err != nil {
		relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.TTL)
		defer cancel()
		_ = l.Release(relCtx)
		return err
	}
	l.mu.Lock()
	l.afterRenew = func(ctx context.Context) {
		if err := c.q.JobRunHeartbeat(ctx, c.pool, r.id); err != nil {
			c.log.Debug("pgbaton: job run heartbeat failed", "job", job, "run", r.id, "error", err)
		}
	}
	l.mu.Unlock()

	var fnErr error
	err = c.runUnder(ctx, l, func(fnCtx context.Context) error {
		fnErr = fn(fnCtx, r)
		// Record the outcome while the lease is still held, so the status
		// write is fenced like a checkpoint.
		return r.finish(ctx, fnCtx, fnErr)
	})
	if fnErr != nil {
		return fnErr
	}
	return err
}

// startRun records the run and reads the checkpoint a previous
// unfinished run left. The lease keeps others from writing it meanwhile.
func (c *Client) startRun(ctx context.Context, job string, l *Lease) (*Run, error) {
	row, err := c.q.JobRunStart(ctx, c.pool, db.JobRunStartParams{Job: job, Owner: c.cfg.Owner, Token: l.token})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: job %q: lease lost before the run was recorded", ErrLeaseLost, job)
	}
	if err != nil {
		return nil, c.dbError("start run of "+job, err)
	}
	r := &Run{c: c, id: row.ID, job: job, lease: l}
	v, err := fencedwrite.GetValue(ctx, c.pool, CheckpointKey(job))
	switch {
	case errors.Is(err, fencedwrite.ErrNotFound):
	case err != nil:
		return nil, c.dbError("read checkpoint of "+job, err)
	default:
		r.checkpoint = v.Data
	}
	return r, nil
}

// finish records the run's end. fnCtx tells a lost lease from a cancelled
// caller.
func (r *Run) finish(ctx, fnCtx context.Context, fnErr error) error {
	status := RunSucceeded
	var msg pgtype.Text
	switch {
	case r.lease.Err() != nil && errors.Is(r.lease.Err(), ErrLeaseLost):
		status = RunLost
	case fnErr != nil && ctx.Err() != nil:
		status = RunCancelled
	case fnErr != nil:
		status = RunFailed
	}
	if fnErr != nil {
		msg = pgtype.Text{String: fnErr.Error(), Valid: true}
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.c.cfg.TTL)
	defer cancel()
	p := db.JobRunFinishParams{Status: status, Error: msg, ID: r.id, Job: r.job, Owner: r.c.cfg.Owner, Token: r.lease.token}
	var err error
	if status == RunSucceeded {
		// The job is done: the next run starts afresh. Fenced like the
		// status write, in the same transaction.
		err = pgx.BeginFunc(wctx, r.c.pool, func(tx pgx.Tx) error {
			if _, err := r.c.q.JobRunFinish(wctx, tx, p); err != nil {
				return err
			}
			err := fencedwrite.DeleteValue(wctx, tx, CheckpointKey(r.job), r.lease.token)
			if errors.Is(err, fencedwrite.ErrNotFound) {
				return nil
			}
			return err
		})
	} else {
		_, err = r.c.q.JobRunFinish(wctx, r.c.pool, p)
	}
	if (errors.Is(err, pgx.ErrNoRows) || errors.Is(err, fencedwrite.ErrStaleToken)) && status != RunLost {
		// The lease was lost between fn's return and this write.
		p.Status = RunLost
		_, err = r.c.q.JobRunFinish(wctx, r.c.pool, p)
		if err == nil || errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: job %q run %d", ErrLeaseLost, r.job, r.id)
		}
	}
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil // marked lost already by the holder that took over
	}
	if err != nil {
		return r.c.dbError("finish run of "+r.job, err)
	}
	if status == RunLost {
		return fmt.Errorf("%w: job %q run %d", ErrLeaseLost, r.job, r.id)
	}
	return nil
}

// Runs lists the newest runs of job, newest first, at most limit.
func (c *Client) Runs(ctx context.Context, job string, limit int) ([]RunInfo, error) {
	if err := checkName("job name", job); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, invalid("limit must be positive, got %d", limit)
	}
	rows, err := c.q.JobRunList(ctx, c.pool, db.JobRunListParams{Job: job, Max: int32(min(limit, 1<<30))})
	if err != nil {
		return nil, c.dbError("list runs of "+job, err)
	}
	out := make([]RunInfo, len(rows))
	for i, r := range rows {
		out[i] = RunInfo{ID: r.ID, Job: r.Job, Owner: r.Owner, Token: r.Token, Status: r.Status,
			StartedAt: r.StartedAt, FinishedAt: r.FinishedAt, HeartbeatAt: r.HeartbeatAt,
			Error: r.Error.String, Checkpoint: r.Checkpoint}
	}
	return out, nil
}

// RunInfo is a row of pgbaton.job_run.
type RunInfo struct {
	ID          int64
	Job         string
	Owner       string
	Token       int64
	Status      string
	StartedAt   time.Time
	FinishedAt  *time.Time
	HeartbeatAt time.Time
	Error       string
	Checkpoint  []byte
}
