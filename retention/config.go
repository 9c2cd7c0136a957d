package retention

import (
	"fmt"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/prune"
)

// Config says how long pgbaton keeps the rows of the tables that pile up
// with use outside leasetable's own, and how Run prunes them. Each
// duration is how long rows of that kind are kept: zero means its
// default, a negative one keeps them forever. Rows go oldest first, Batch
// per statement, by the rules of pgbaton.prune (see its migration). The
// zero value prunes with the documented defaults.
type Config struct {
	// Interval is the time between Run's pruning passes; each pass holds
	// the lease leasetable.RetentionLease, so only one process of a fleet
	// prunes at a time. Default 1 minute.
	Interval time.Duration
	// Batch is how many rows one statement deletes at most. Default 1000.
	Batch int

	CronSlots         time.Duration // claimed cron slots (jobs.ClaimSlot), by scheduled time; default 7 days
	JobRuns           time.Duration // finished job runs (jobs.Do; never a job's newest); default 30 days
	Events            time.Duration // the audit log of forced releases; default 365 days
	FencedValues      time.Duration // fenced values (checkpoints) not written since; default 90 days
	AdvisoryNames     time.Duration // advisory lock names not registered since; default 90 days
	ProcessedMessages time.Duration // idempotent-consumer records (fencedwrite.MarkProcessed); default 7 days
}

// rules are the tables of Config that pgbaton.prune knows, with the
// field and default of each.
func (c *Config) rules() []prune.Rule {
	return []prune.Rule{
		{Table: "cron_slot", Keep: &c.CronSlots, Default: 7 * 24 * time.Hour},
		{Table: "job_run", Keep: &c.JobRuns, Default: 30 * 24 * time.Hour},
		{Table: "processed_message", Keep: &c.ProcessedMessages, Default: 7 * 24 * time.Hour},
		{Table: "fenced_value", Keep: &c.FencedValues, Default: 90 * 24 * time.Hour},
		{Table: "advisory_name", Keep: &c.AdvisoryNames, Default: 90 * 24 * time.Hour},
		{Table: "event", Keep: &c.Events, Default: 365 * 24 * time.Hour},
	}
}

func (c Config) withDefaults() (Config, error) {
	if p := prune.Defaults("retention.Config", &c.Interval, &c.Batch, c.rules()); p != "" {
		return c, invalid("%s", p)
	}
	return c, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{pgbaton.ErrInvalidArgument}, args...)...)
}
