package leasetable

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/schema"
	"github.com/pgbaton/pgbaton/internal/session"
)

// Check reports whether the client is healthy, for readiness probes (it
// satisfies health.Checker). It returns nil when the client is open, the
// database answers within ctx, is a primary and has the pgbaton schema
// this build needs (as New checks), the LISTEN connection (if
// a wait has started it) delivers a notification sent now, and no held
// lease is overdue for renewal: its last successful acquire or renewal was
// sent more than RenewInterval + RenewInterval/2 ago, so renewals are
// failing or hanging and the lease will be lost at its local deadline
// unless one succeeds. A primary whose standbys are all asynchronous does
// not fail Check, but is logged (Warn) when Check or New first sees it
// (see Client.Replication). Otherwise the error says what is wrong; several
// problems are joined. A database or LISTEN connection that does not
// answer makes Check wait as long as ctx allows, and at most the TTL when
// ctx has no deadline.
func (c *Client) Check(ctx context.Context) error {
	if err := c.checkOpen(); err != nil {
		return fmt.Errorf("%w: leasetable client", err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.TTL)
		defer cancel()
	}
	var errs []error
	info, err := c.q.ServerInfo(ctx, c.pool)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("leasetable: database did not answer: %w", err))
	case info.InRecovery:
		errs = append(errs, fmt.Errorf("%w: the database is in recovery (failed over?); connect to the primary", pgbaton.ErrStandby))
	default:
		if err := schema.Check(ctx, c.pool); err != nil && !errors.Is(err, pgbaton.ErrSchemaTooNew) {
			errs = append(errs, err)
			break
		}
		// Logged, not failed: see ReplicationStatus.Err.
		c.repl.Observe(ctx, c.pool, c.log, ErrNoSyncStandby)
		// A ping that failed would fail the notification too: say it once.
		if err := c.ln.Check(ctx, c.newID("check/")); err != nil {
			errs = append(errs, err)
		}
	}
	if n, overdue := c.overdue(); n > 0 {
		errs = append(errs, fmt.Errorf("leasetable: %d lease(s) overdue for renewal (renewals failing or hanging; lost at the local deadline unless one succeeds): %s",
			n, strings.Join(overdue, ", ")))
	}
	return errors.Join(errs...)
}

// overdue describes the held leases whose last successful keep-alive is
// overdue (session.Overdue).
func (c *Client) overdue() (n int, out []string) {
	c.k.Ask(func(k *keeper) {
		if s := k.sess; s != nil {
			n, out = session.Overdue(s, k.leases.Live, c.cfg.RenewInterval, time.Now())
		}
	})
	return n, out
}
