package leasetable

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// RetentionLease is the lease a Client holds while it prunes, so that one
// client of a fleet prunes at a time. Do not use the name otherwise.
const RetentionLease = "pgbaton:retention"

// Retention says how long pgbaton keeps the rows that pile up with use,
// and how a Client prunes them in the background. Each duration is how
// long rows of that kind are kept: zero means its default, a negative one
// keeps them forever. Rows go oldest first, Batch per statement, by the
// rules of pgbaton.prune (see its migration): work items are deleted when
// completed, and leases of a group (registered items, shards, semaphore
// slots) are never pruned.
type Retention struct {
	// Disabled stops this client's background pruning: another client
	// prunes, or you call Prune from a job of your own.
	Disabled bool
	// Interval is the time between a client's pruning passes; each pass
	// holds the lease RetentionLease, so only one client of a fleet prunes
	// at a time. Default 1 minute.
	Interval time.Duration
	// Batch is how many rows one statement deletes at most. Default 1000.
	Batch int

	CronSlots         time.Duration // claimed cron slots, by scheduled time; default 7 days
	JobRuns           time.Duration // finished job runs (never a job's newest); default 30 days
	Events            time.Duration // the audit log of forced releases; default 365 days
	Waiters           time.Duration // waiter registrations of crashed waiters; default 1 day
	FencedValues      time.Duration // fenced values (checkpoints) not written since; default 90 days
	AdvisoryNames     time.Duration // advisory lock names not registered since; default 90 days
	ProcessedMessages time.Duration // idempotent-consumer records (fencedwrite.MarkProcessed); default 7 days
	Leases            time.Duration // named leases (no group) neither held nor granted since; default 7 days
	Sessions          time.Duration // dead lease sessions; default 1 minute
}

// retentionRules are the tables pgbaton.prune knows, with the Retention
// field and default of each.
var retentionRules = []struct {
	table string
	field func(*Retention) *time.Duration
	def   time.Duration
}{
	{"lease_session", func(r *Retention) *time.Duration { return &r.Sessions }, time.Minute},
	{"lease_waiter", func(r *Retention) *time.Duration { return &r.Waiters }, 24 * time.Hour},
	{"cron_slot", func(r *Retention) *time.Duration { return &r.CronSlots }, 7 * 24 * time.Hour},
	{"job_run", func(r *Retention) *time.Duration { return &r.JobRuns }, 30 * 24 * time.Hour},
	{"lease", func(r *Retention) *time.Duration { return &r.Leases }, 7 * 24 * time.Hour},
	{"processed_message", func(r *Retention) *time.Duration { return &r.ProcessedMessages }, 7 * 24 * time.Hour},
	{"fenced_value", func(r *Retention) *time.Duration { return &r.FencedValues }, 90 * 24 * time.Hour},
	{"advisory_name", func(r *Retention) *time.Duration { return &r.AdvisoryNames }, 90 * 24 * time.Hour},
	{"event", func(r *Retention) *time.Duration { return &r.Events }, 365 * 24 * time.Hour},
}

func (r Retention) withDefaults() (Retention, error) {
	if r.Interval == 0 {
		r.Interval = time.Minute
	}
	if r.Interval < 0 {
		return r, invalid("Retention.Interval must be positive, got %s", r.Interval)
	}
	if r.Batch == 0 {
		r.Batch = 1000
	}
	if r.Batch < 0 || r.Batch > 100000 {
		return r, invalid("Retention.Batch must be in 1..100000, got %d", r.Batch)
	}
	for _, rule := range retentionRules {
		if d := rule.field(&r); *d == 0 {
			*d = rule.def
		} else if *d > 0 && *d < time.Millisecond {
			return r, invalid("retention of %s must be at least 1ms, got %s", rule.table, *d)
		}
	}
	return r, nil
}

// Pruned counts the rows a pruning pass deleted, by table.
type Pruned map[string]int

// Prune runs one pruning pass over every table with a retention: batches
// of each until one comes back short or ctx ends. It does not take
// RetentionLease; a Client's background pruning does. Use it from your own
// scheduled job when Retention.Disabled is set everywhere.
func Prune(ctx context.Context, pool *pgxpool.Pool, r Retention) (Pruned, error) {
	if pool == nil {
		return nil, invalid("nil pool")
	}
	r, err := r.withDefaults()
	if err != nil {
		return nil, err
	}
	return prune(ctx, db.New(), pool, r)
}

func prune(ctx context.Context, q *db.Queries, pool *pgxpool.Pool, r Retention) (Pruned, error) {
	out := Pruned{}
	for _, rule := range retentionRules {
		keep := *rule.field(&r)
		if keep < 0 {
			continue
		}
		p := db.PruneParams{TableName: rule.table, OlderThan: pgtype.Interval{Microseconds: keep.Microseconds(), Valid: true}, Batch: int32(r.Batch)}
		for {
			n, err := q.Prune(ctx, pool, p)
			if err != nil {
				return out, fmt.Errorf("leasetable: prune %s: %w", rule.table, mapDBError("prune", err))
			}
			out[rule.table] += int(n)
			if int(n) < r.Batch {
				break
			}
		}
	}
	return out, nil
}

// pruneLoop is a Client's background pruning: every Interval (with
// jitter, so a fleet started at once does not knock together) it tries to
// take RetentionLease and, if it gets it, prunes under it.
func (c *Client) pruneLoop(ctx context.Context) {
	r := c.cfg.Retention
	t := time.NewTimer(r.Interval/2 + rand.N(r.Interval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.prunePass(ctx)
		t.Reset(r.Interval + rand.N(r.Interval/10+1))
	}
}

func (c *Client) prunePass(ctx context.Context) {
	l, err := c.TryAcquire(ctx, RetentionLease)
	switch {
	case errors.Is(err, ErrHeld), errors.Is(err, pgbaton.ErrClosed), ctx.Err() != nil:
		return
	case err != nil:
		c.log.Debug("pgbaton: retention lease not taken", "error", err)
		return
	}
	defer func() { _ = l.Release(ctx) }()
	start := time.Now()
	// Stops when the lease is lost: another client may prune now.
	got, err := prune(l.Context(), c.q, c.pool, c.cfg.Retention)
	total := 0
	for _, n := range got {
		total += n
	}
	switch {
	case err != nil && l.Err() == nil:
		c.log.Warn("pgbaton: pruning failed; trying again at the next pass", "error", err, "deleted", got)
	case total > 0:
		c.log.Info("pgbaton: pruned old rows", "deleted", got, "took", time.Since(start).Round(time.Millisecond))
	}
}
