package leasetable

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// Acquire takes the lease name, waiting while someone else holds it. It
// wakes when the holder releases (LISTEN/NOTIFY on the client's one
// listening connection) or at the holder's known expiry plus a little
// jitter; it never polls. It returns ctx's error when ctx ends first: the
// caller did not get the lease.
func (c *Client) Acquire(ctx context.Context, name string) (*Lease, error) {
	if err := checkName("lease name", name); err != nil {
		return nil, err
	}
	return c.acquire(ctx, name, nil)
}

func (c *Client) acquire(ctx context.Context, name string, metadata []byte) (*Lease, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	start := time.Now()
	l, stillHeld, err := c.waitAcquire(ctx, name, metadata, start)
	c.waitEnded(ctx, name, start, stillHeld, err)
	return l, err
}

// waitAcquire is acquire without the failure metric. stillHeld tells a
// wait that ended while somebody else held the lease.
func (c *Client) waitAcquire(ctx context.Context, name string, metadata []byte, start time.Time) (l *Lease, stillHeld bool, err error) {
	l, err = c.attempt(ctx, name, metadata, start)
	var held *HeldError
	if !errors.As(err, &held) {
		return l, false, err // granted at once (the common case) or failed
	}
	w, err := c.startWaiting(ctx, name, false)
	if err != nil {
		return nil, true, err
	}
	defer w.stop()
	for {
		// Look again after registering: a release before the registration
		// notified nobody.
		l, err := c.attempt(ctx, name, metadata, start)
		if !errors.As(err, &held) {
			return l, false, err
		}
		c.log.Debug("pgbaton: waiting for lease", "lease", name, "holder", held.Holder, "expires_in", held.remaining)
		if err := c.wait(ctx, w.wake, held.remaining); err != nil {
			return nil, true, fmt.Errorf("leasetable: waiting for lease %q (held by %q): %w", name, held.Holder, err)
		}
	}
}

// waiting is a registered waiter: subscribed to notifications for some
// lease names and recorded in pgbaton.lease_waiter, so releases notify.
type waiting struct {
	c           *Client
	name, id    string
	wake        <-chan struct{}
	unsubscribe func()
}

// startWaiting subscribes to notifications for name, then registers as a
// waiter for lease name, or for any lease of group name when group is set.
// The order matters: by the time a release can see the registration, the
// LISTEN is active.
func (c *Client) startWaiting(ctx context.Context, name string, group bool) (*waiting, error) {
	wake, unsubscribe, err := c.ln.subscribe(ctx, name)
	if err != nil {
		return nil, err
	}
	id := c.waiterPrefix + strconv.FormatInt(c.waiterSeq.Add(1), 10)
	if err := c.q.LeaseWaitFor(ctx, c.pool, db.LeaseWaitForParams{Name: name, Waiter: id, IsGroup: group}); err != nil {
		unsubscribe()
		return nil, c.dbError("register waiter for "+name, err)
	}
	return &waiting{c: c, name: name, id: id, wake: wake, unsubscribe: unsubscribe}, nil
}

// stop unsubscribes and removes the registration in the background: the
// waiter's id is unique, so no later registration can be removed by it.
func (w *waiting) stop() {
	w.unsubscribe()
	w.c.goBackground(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, w.c.cfg.TTL)
		defer cancel()
		if err := w.c.q.LeaseStopWaiting(ctx, w.c.pool, db.LeaseStopWaitingParams{Name: w.name, Waiter: w.id}); err != nil {
			w.c.log.Debug("pgbaton: removing waiter registration failed", "lease", w.name, "error", err)
		}
	})
}

// wait blocks until a wake-up, until the known expiry (d from now) plus
// jitter, or until ctx or the client ends.
func (c *Client) wait(ctx context.Context, wake <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(max(d, 0) + jitter(c.cfg.TTL))
	defer t.Stop()
	select {
	case <-wake:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-c.bg.Done():
		return pgbaton.ErrClosed
	}
}

// jitter spreads waiters that look again at the same expiry: up to 1% of
// the TTL, at least 1ms and at most 20ms.
func jitter(ttl time.Duration) time.Duration {
	hi := min(max(ttl/100, time.Millisecond), 20*time.Millisecond)
	return time.Millisecond + rand.N(hi)
}
