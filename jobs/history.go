package jobs

import (
	"context"
	"time"

	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/leasetable"
)

// Run statuses stored in pgbaton.job_run.status.
const (
	Started   = "started"
	Succeeded = "succeeded"
	Failed    = "failed"
	Cancelled = "cancelled"
	Lost      = "lost"
)

// RunInfo is a row of pgbaton.job_run.
type RunInfo struct {
	ID          int64      // the run's id in pgbaton.job_run, as Run.ID
	Job         string     // the job's name, which is also its lease's name
	Owner       string     // the Owner of the leasetable.Client that ran it
	Token       int64      // the job lease's token the run started under; its checkpoints are fenced by it
	Status      string     // Started, Succeeded, Failed, Cancelled or Lost
	StartedAt   time.Time  // database clock
	FinishedAt  *time.Time // database clock; nil while Status is Started
	HeartbeatAt time.Time  // database clock: the run's start, then its last keep-alive or checkpoint
	Error       string     // the error Do's fn returned, as text; empty when it returned nil or the run never recorded its end
	Checkpoint  []byte     // the JSON the run last stored with Run.Checkpoint; nil when it stored none
}

// Runs lists the newest runs of job, newest first, at most limit.
func Runs(ctx context.Context, c *leasetable.Client, job string, limit int) ([]RunInfo, error) {
	if err := checkJob(job); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, invalid("limit must be positive, got %d", limit)
	}
	pool, err := c.Pool()
	if err != nil {
		return nil, err
	}
	rows, err := db.New().JobRunList(ctx, pool, db.JobRunListParams{Job: job, Max: int32(min(limit, 1<<30))})
	if err != nil {
		return nil, dbError("list runs of "+job, err)
	}
	out := make([]RunInfo, len(rows))
	for i, r := range rows {
		out[i] = RunInfo{ID: r.ID, Job: r.Job, Owner: r.Owner, Token: r.Token, Status: r.Status,
			StartedAt: r.StartedAt, FinishedAt: r.FinishedAt, HeartbeatAt: r.HeartbeatAt,
			Error: r.Error.String, Checkpoint: r.Checkpoint}
	}
	return out, nil
}
