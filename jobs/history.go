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
	ID          int64
	Job         string
	Owner       string
	Token       int64
	Status      string // Started, Succeeded, Failed, Cancelled or Lost
	StartedAt   time.Time
	FinishedAt  *time.Time
	HeartbeatAt time.Time
	Error       string
	Checkpoint  []byte
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
