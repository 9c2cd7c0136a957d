// Package backoff is the one retry delay pgbaton's loops share:
// exponential, capped, jittered, reset after a success. The loops wait on
// it in selects of their own, next to notifications, expiries and their
// context, which is why it hands out delays instead of running a closure
// the way retry libraries do. It also paces a waiter's next look when
// nothing may wake it (SlotlessPoll, QueuePoll, WaitFor) and through an
// outage (Outage).
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff hands out growing delays: Min, then doubling up to Max, each
// spread by Jitter. The zero value is not useful; set Min and Max. Not
// safe for concurrent use: one per loop.
type Backoff struct {
	Min, Max time.Duration
	next     time.Duration
}

// Next returns the delay before the next try and doubles the one after.
func (b *Backoff) Next() time.Duration {
	d := max(b.next, b.Min)
	b.next = min(2*d, b.Max)
	return Jitter(min(d, b.Max))
}

// Reset starts again at Min, after a success.
func (b *Backoff) Reset() { b.next = 0 }

// Jitter spreads d over [0.75d, 1.25d], so that processes retrying at the
// same moment drift apart.
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d*3/4 + rand.N(d/2+1)
}

// Sleep waits d, and reports false when ctx ends first.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
