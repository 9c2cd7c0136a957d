package retention

import (
	"context"
	"errors"

	"github.com/pgbaton/pgbaton/internal/prune"
	"github.com/pgbaton/pgbaton/leasetable"
)

// Run prunes in the background of a service until ctx ends: every
// cfg.Interval (with jitter, so that a fleet started at once does not
// knock together) it tries to take leasetable.RetentionLease through c
// and, if it gets it, runs a pass of Prune under it, stopping when the
// lease is lost. Run it on every node, or on some: one prunes at a time,
// and another takes over when it stops. Passes log through c's
// Config().Logger (Info: what was deleted; Warn: a failed pass, tried
// again at the next one).
//
// It returns ctx's cause when ctx ends, pgbaton.ErrClosed once c is
// closed, and at once an error wrapping pgbaton.ErrInvalidArgument for a
// bad cfg.
func Run(ctx context.Context, c *leasetable.Client, cfg Config) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	pool, err := c.Pool()
	if err != nil {
		return err
	}
	return prune.Leased(ctx, cfg.Interval, c.Config().Logger,
		func(ctx context.Context) (prune.Lease, error) { return c.TryAcquire(ctx, leasetable.RetentionLease) },
		func(err error) bool { return errors.Is(err, leasetable.ErrHeld) },
		func(ctx context.Context) (map[string]int, error) { return cfg.prune(ctx, pool) })
}
