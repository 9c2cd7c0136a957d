package leasetable

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/internal/prune"
)

// RetentionLease is the lease held while pgbaton prunes old rows, so that
// one process of a fleet prunes at a time: a Client's background pruning
// of the lease tables holds it, and so does package retention's loop,
// which prunes the other tables. Do not use the name otherwise.
const RetentionLease = "pgbaton:retention"

// Retention says how long leasetable keeps the rows of its own tables
// that pile up with use, and how a Client prunes them in the background.
// Each duration is how long rows of that kind are kept: zero means its
// default, a negative one keeps them forever. Rows go oldest first, Batch
// per statement, by the rules of pgbaton.prune (see its migration): work
// items are deleted when completed, and leases of a group (registered
// items, shards, semaphore slots) are never pruned. The other layers'
// tables are package retention's, which a service runs itself.
type Retention struct {
	// Disabled stops this client's background pruning: another client
	// prunes, or you call Prune from a job of your own.
	Disabled bool
	// Interval is the time between a client's pruning passes; each pass
	// holds the lease RetentionLease, so only one process of a fleet
	// prunes at a time. Default 1 minute.
	Interval time.Duration
	// Batch is how many rows one statement deletes at most. Default 1000.
	Batch int

	Waiters  time.Duration // waiter registrations of crashed waiters; default 1 day
	Leases   time.Duration // named leases (no group) neither held nor granted since; default 7 days
	Sessions time.Duration // dead sessions (pgbaton.lease_session rows); default 1 minute
}

// rules are leasetable's tables that pgbaton.prune knows, with the
// Retention field and default of each.
func (r *Retention) rules() []prune.Rule {
	return []prune.Rule{
		{Table: "lease_session", Keep: &r.Sessions, Default: time.Minute},
		{Table: "lease_waiter", Keep: &r.Waiters, Default: 24 * time.Hour},
		{Table: "lease", Keep: &r.Leases, Default: 7 * 24 * time.Hour},
	}
}

func (r Retention) withDefaults() (Retention, error) {
	if p := prune.Defaults("Retention", &r.Interval, &r.Batch, r.rules()); p != "" {
		return r, invalid("%s", p)
	}
	return r, nil
}

// Pruned counts the rows a pruning pass deleted, by table.
type Pruned map[string]int

// Prune runs one pruning pass over leasetable's tables: batches of each
// until one comes back short or ctx ends. It does not take
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
	return r.prune(ctx, pool)
}

func (r Retention) prune(ctx context.Context, pool *pgxpool.Pool) (Pruned, error) {
	got, err := prune.Tables(ctx, pool, r.rules(), r.Batch)
	if err != nil {
		err = mapDBError("retention", err)
	}
	return got, err
}

// pruneLoop is a Client's background pruning: every Interval it tries to
// take RetentionLease and, if it gets it, prunes under it.
func (c *Client) pruneLoop(ctx context.Context) {
	_ = prune.Leased(ctx, c.cfg.Retention.Interval, c.log,
		func(ctx context.Context) (prune.Lease, error) { return c.TryAcquire(ctx, RetentionLease) },
		func(err error) bool { return errors.Is(err, ErrHeld) },
		func(ctx context.Context) (map[string]int, error) { return c.cfg.Retention.prune(ctx, c.pool) })
}
