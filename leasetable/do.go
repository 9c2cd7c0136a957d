package leasetable

import (
	"context"
	"errors"
	"fmt"
)

// Do acquires the lease name (waiting like Acquire), runs fn with a
// context that is cancelled, with cause ErrLeaseLost, if the lease is lost,
// and releases the lease on every path. If the lease was lost while fn
// ran, the error returned wraps ErrLeaseLost, even if fn returned nil
// (fn may not have run alone, so do not acknowledge its work), joined with
// fn's error if fn failed too. Otherwise it returns fn's error.
func (c *Client) Do(ctx context.Context, name string, fn func(ctx context.Context) error) error {
	if fn == nil {
		return invalid("nil function")
	}
	l, err := c.Acquire(ctx, name)
	if err != nil {
		return err
	}
	return c.runUnder(ctx, l, func(ctx context.Context) error { return fn(ctx) })
}

// runUnder runs fn under l and releases l afterwards. A loss of l while fn
// ran is always in the error it returns, joined with fn's.
func (c *Client) runUnder(ctx context.Context, l *Lease, fn func(ctx context.Context) error) (err error) {
	fnCtx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.Context(), func() { cancel(l.Err()) })
	defer func() {
		stop()
		cancel(nil)
		lost := l.Err() // nil unless the lease ended before fn returned
		relCtx, relCancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.TTL)
		defer relCancel()
		relErr := l.Release(relCtx)
		var loss error
		switch {
		case lost != nil:
			loss = lost
		case relErr != nil && errors.Is(relErr, ErrNotHeld):
			loss = fmt.Errorf("%w: %w", ErrLeaseLost, relErr)
		case relErr != nil:
			// The work ran under a valid lease; the row expires by itself.
			c.log.Warn("pgbaton: release after Do failed; the lease expires at its TTL",
				"lease", l.name, "ttl", c.cfg.TTL, "error", relErr)
		}
		switch {
		case loss == nil:
		case err == nil:
			err = loss
		default:
			err = errors.Join(err, loss)
		}
	}()
	return fn(fnCtx)
}
