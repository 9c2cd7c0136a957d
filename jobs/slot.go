package jobs

import (
	"context"
	"time"

	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/leasetable"
)

// ClaimSlot claims the run of job scheduled at scheduledAt for c's owner
// and reports whether this caller got it: true for exactly one caller per
// (job, scheduledAt) across all nodes, however skewed their tickers. Pass
// the nominal time of the schedule (e.g. 12:00:00 for an hourly job), not
// the time the ticker fired; it is kept to the microsecond, as Postgres
// stores it. Claimed slots stay in pgbaton.cron_slot as the record of who
// ran what, until package retention prunes them.
func ClaimSlot(ctx context.Context, c *leasetable.Client, job string, scheduledAt time.Time) (bool, error) {
	if err := checkJob(job); err != nil {
		return false, err
	}
	if scheduledAt.IsZero() {
		return false, invalid("zero scheduled time for job %q", job)
	}
	pool, err := c.Pool()
	if err != nil {
		return false, err
	}
	claimed, err := db.New().CronSlotClaim(ctx, pool, db.CronSlotClaimParams{
		Job: job, ScheduledAt: scheduledAt.Truncate(time.Microsecond), Owner: c.Owner(),
	})
	if err != nil {
		return false, dbError("claim slot of "+job, err)
	}
	return claimed, nil
}
