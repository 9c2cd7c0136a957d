package leasetable

import (
	"context"
	"fmt"
	"time"

	"github.com/pgbaton/pgbaton/internal/listener"
	"github.com/pgbaton/pgbaton/internal/semaphore"
	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// MaxSlots bounds Semaphore's slot count.
const MaxSlots = 10000

// Semaphore takes one of slots permits named name, waiting while all are
// held: at most slots leases of the semaphore are live at once. Each
// permit is a lease row "name#i" in group name, claimed with Claim; Release
// the returned lease to give the permit back. Every caller must pass the
// same slots for a name (pgbaton.ErrInvalidArgument otherwise).
//
// Waiters are served in the order they came: a released permit goes to
// the one that has waited longest (woken by the release), or is taken at
// the earliest expiry of a held one. Like Acquire it waits out a server
// that cannot be reached, until ctx ends.
func (c *Client) Semaphore(ctx context.Context, name string, slots int) (*Lease, error) {
	names, err := c.semaphoreNames(name, slots)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	return first(c.waitCall(ctx, spanAcquire, telemetry.GroupKey, start, want{kind: "semaphore", name: name, look: func(ctx context.Context, w *listener.Waiter) ([]*Lease, error) {
		if err := c.registerSemaphore(ctx, name, names); err != nil {
			return nil, err
		}
		return c.claim(ctx, name, 1, start, w, true)
	}}))
}

// TrySemaphore is Semaphore without the wait: it takes a free permit if
// there is one and no waiter is ahead, and returns an error wrapping
// ErrHeld otherwise.
func (c *Client) TrySemaphore(ctx context.Context, name string, slots int) (*Lease, error) {
	names, err := c.semaphoreNames(name, slots)
	if err != nil {
		return nil, err
	}
	return first(c.once(ctx, spanAcquire, telemetry.GroupKey, name, func(ctx context.Context, start time.Time) ([]*Lease, error) {
		if err := c.registerSemaphore(ctx, name, names); err != nil {
			return nil, err
		}
		got, err := c.claim(ctx, name, 1, start, nil, true)
		if err == nil && len(got) == 0 {
			err = fmt.Errorf("%w: semaphore %q: all %d permits held, or waiters ahead", ErrHeld, name, slots)
		}
		return got, err
	}))
}

// semaphoreNames checks a semaphore's arguments and that c is open, and
// names its permits.
func (c *Client) semaphoreNames(name string, slots int) ([]string, error) {
	if err := checkName("semaphore name", name); err != nil {
		return nil, err
	}
	names, err := semaphore.Permits(name, slots, MaxSlots, MaxNameLen)
	if err != nil {
		return nil, err
	}
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	return names, nil
}

// registerSemaphore registers the permits names of semaphore name, once
// per client, and checks their count.
func (c *Client) registerSemaphore(ctx context.Context, name string, names []string) error {
	if known, ok := c.sems.Load(name); ok && known.(int) == len(names) {
		return nil
	}
	// Count before registering, so a wrong count changes nothing. Sent
	// as a wait's statements are (inFlight), so a caller that gives up
	// costs the pool no connection.
	n, err := inFlight(c, ctx, func(ctx context.Context) (int32, error) {
		n, err := c.q.LeaseGroupCount(ctx, c.pool, name)
		if err != nil {
			return 0, c.dbError("semaphore "+name, err)
		}
		if n == 0 {
			if _, err := c.register(ctx, name, names); err != nil {
				return 0, err
			}
			if n, err = c.q.LeaseGroupCount(ctx, c.pool, name); err != nil {
				return 0, c.dbError("semaphore "+name, err)
			}
		}
		return n, nil
	}, nil)
	if err != nil {
		return err
	}
	if err := semaphore.CheckCount(name, int(n), len(names)); err != nil {
		return err
	}
	c.sems.Store(name, len(names))
	return nil
}
