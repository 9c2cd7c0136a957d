package leasetable

import (
	"context"
	"time"

	"github.com/pgbaton/pgbaton/internal/db"
)

// ClaimSlot claims the run of job scheduled at scheduledAt and reports
// whether this caller got it: true for exactly one caller per (job,
// scheduledAt) across all nodes, however skewed their tickers. Pass the
// nominal time of the schedule (e.g. 12:00:00 for an hourly job), not the
// time the ticker fired; it is kept to the microsecond, as Postgres stores
// it. Claimed slots stay in pgbaton.cron_slot as the record of who ran
// what.
func (c *Client) ClaimSlot(ctx context.Context, job string, scheduledAt time.Time) (bool, error) {
	if err := checkName("job name", job); err != nil {
		return false, err
	}
	if scheduledAt.IsZero() {
		return false, invalid("zero scheduled time for job %q", job)
	}
	if err := c.checkOpen(); err != nil {
		return false, err
	}
	claimed, err := c.q.CronSlotClaim(ctx, c.pool, db.CronSlotClaimParams{
		Job: job, ScheduledAt: scheduledAt.Truncate(time.Microsecond), Owner: c.cfg.Owner,
	})
	if err != nil {
		return false, c.dbError("claim slot of "+job, err)
	}
	return claimed, nil
}
