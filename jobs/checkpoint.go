package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/leasetable"
)

// CheckpointKeyPrefix starts the pgbaton.fenced_value key of a job's
// checkpoint: the key is the prefix and the job's name.
const CheckpointKeyPrefix = "job:"

// MaxNameLen is the longest job name Do accepts, in bytes: its checkpoint
// key must fit in leasetable.MaxNameLen.
const MaxNameLen = leasetable.MaxNameLen - len(CheckpointKeyPrefix)

// CheckpointKey is the pgbaton.fenced_value key under which runs of job
// keep their checkpoint, for fencedwrite.GetValue and tools.
func CheckpointKey(job string) string { return CheckpointKeyPrefix + job }

// Checkpoint stores state (as JSON) as the run's progress, only while the
// run's lease is still valid. In one transaction it guards the lease
// (fencedwrite.Guard: this token, not expired, row locked FOR SHARE until
// commit), writes the fenced value CheckpointKey(job) with the run's token
// (fencedwrite.PutValue: refused if a newer token wrote it) and copies it
// to pgbaton.job_run.checkpoint for `pgbaton runs`. After a loss it
// returns an error wrapping both leasetable.ErrLeaseLost and
// fencedwrite.ErrStaleToken and stores nothing, so a stale run can never
// overwrite the progress of the run that took over.
func (r *Run) Checkpoint(ctx context.Context, state any) error {
	if err := r.lease.Err(); err != nil {
		return fmt.Errorf("jobs: checkpoint of job %q: %w", r.job, err)
	}
	b, err := json.Marshal(state)
	if err != nil {
		return invalid("checkpoint state: %v", err)
	}
	token := r.lease.Token()
	err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if err := fencedwrite.Guard(ctx, tx, r.job, token); err != nil {
			return err
		}
		if _, err := fencedwrite.PutValue(ctx, tx, CheckpointKey(r.job), token, b); err != nil {
			return err
		}
		_, err := r.q.JobRunCheckpoint(ctx, tx, db.JobRunCheckpointParams{
			Checkpoint: b, ID: r.id, Token: token, Job: r.job, Owner: r.c.Owner(),
		})
		if errors.Is(err, pgx.ErrNoRows) {
			// The guard passed, so the run was finished, not taken over.
			return fmt.Errorf("%w: run %d of job %q is no longer running", leasetable.ErrNotHeld, r.id, r.job)
		}
		return err
	})
	switch {
	case errors.Is(err, fencedwrite.ErrStaleToken):
		return fmt.Errorf("%w: checkpoint of job %q refused: %w", leasetable.ErrLeaseLost, r.job, err)
	case errors.Is(err, leasetable.ErrNotHeld):
		return err
	case err != nil:
		return dbError("checkpoint "+r.job, err)
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
		return false, fmt.Errorf("jobs: decode checkpoint of job %q: %w", r.job, err)
	}
	return true, nil
}
