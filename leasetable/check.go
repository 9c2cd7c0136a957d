package leasetable

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/schema"
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
// overdue: how many, and at most 5 of them.
func (c *Client) overdue() (n int, out []string) {
	limit := c.cfg.RenewInterval * overdueAfter / 2
	c.k.Ask(func(k *keeper) {
		s := k.sess
		if s == nil {
			return
		}
		since := time.Since(s.RenewedAt)
		if since <= limit {
			return
		}
		leases := k.leases.Live()
		for _, l := range leases[:min(len(leases), 5)] {
			out = append(out, fmt.Sprintf("%q token %d (last kept alive %s ago, lost in %s)", l.name, l.token,
				since.Round(time.Millisecond), max(time.Until(l.Deadline()), 0).Round(time.Millisecond)))
		}
		if len(leases) > len(out) {
			out = append(out, fmt.Sprintf("and %d more", len(leases)-len(out)))
		}
		n = len(leases)
	})
	return n, out
}

// overdueAfter is, in half RenewIntervals, how old the last successful
// keep-alive may be before Check reports the leases overdue: one interval
// and a half, so one late keep-alive on a busy machine is not a failure.
const overdueAfter = 3
