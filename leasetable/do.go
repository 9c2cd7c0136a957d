package leasetable

import (
	"context"
	"errors"
	"fmt"
)

// Do acquires the lease name (waiting like Acquire), runs fn with a
// context that is cancelled, with cause ErrLeaseLost, if the lease is lost,
// and releases the lease on every path. A loss of the lease while fn ran
// is always in the error it returns (joined with fn's error when fn failed
// too), because fn may not have run alone.
func (c *Client) Do(ctx context.Context, name string, fn func(ctx context.Context) error) error {
	if fn == nil {
		return invalid("nil function")
	}
	l, err := c.Acquire(ctx, name)
	if err != nil {
		return err
	}
	return l.Do(ctx, fn)
}

// Do runs fn under the lease as Client.Do does once it has the lease
// (cancelled on a loss, released on every path, a loss always in the
// error), for work that must do something between the acquire and fn, such
// as recording a job run (package jobs).
func (l *Lease) Do(ctx context.Context, fn func(ctx context.Context) error) (err error) {
	if fn == nil {
		_ = l.Release(ctx)
		return invalid("nil function")
	}
	c := l.c
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
