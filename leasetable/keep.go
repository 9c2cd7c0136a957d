package leasetable

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/listener"
	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// KeepConfig configures Client.Keep.
type KeepConfig struct {
	// Group whose leases (shards) to keep. Required.
	Group string
	// Max is how many leases of the group to hold at most. Required. To
	// split N shards evenly over K workers, use about N/K rounded up.
	Max int
	// Work runs for each lease kept, on its own goroutine, with a context
	// that ends (cause ErrLeaseLost) when the lease is lost, or when Keep's
	// context ends. When it returns, the lease is released and Keep looks
	// for another. Required.
	Work func(ctx context.Context, l *Lease)
}

// Keep holds up to cfg.Max leases of cfg.Group until ctx ends: it claims
// free ones and runs cfg.Work for each; whenever it holds fewer than Max
// (nothing more was free, or a lease ended), it waits for a release in the
// group, for the next expiry of a lease somebody else holds, or for one of
// its own to end, and claims again. So the shards of a worker that died
// are taken over at their expiry. While it holds Max it is not in the
// group's wait queue: a release wakes the waiters that can claim. It
// returns ctx's cause once every Work has returned and its lease is
// released, or at once an error that retrying cannot fix.
func (c *Client) Keep(ctx context.Context, cfg KeepConfig) error {
	if err := checkName("group", cfg.Group); err != nil {
		return err
	}
	if cfg.Max <= 0 || cfg.Work == nil {
		return invalid("Keep needs Max > 0 and a Work function, got Max %d", cfg.Max)
	}
	if err := c.checkOpen(); err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	var held atomic.Int64           // leases whose Work runs
	ended := make(chan struct{}, 1) // one of them ended: claim again
	q := want{kind: "group", name: cfg.Group, woken: ended, look: func(_ context.Context, w *listener.Waiter) ([]*Lease, error) {
		return c.once(ctx, spanClaim, telemetry.GroupKey, cfg.Group, func(ctx context.Context, start time.Time) ([]*Lease, error) {
			return c.claim(ctx, cfg.Group, cfg.Max-int(held.Load()), start, w, false)
		})
	}}
	for {
		// At Max only one of its own ending matters. It waits for that out
		// of the group's queue (waitLoop left it with the grant), so that a
		// release's wake-up goes to a waiter that can use it.
		for held.Load() == int64(cfg.Max) {
			select {
			case <-ended:
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-c.bg.Done():
				return pgbaton.ErrClosed
			}
		}
		got, _, err := c.waitLoop(ctx, q)
		for _, l := range got {
			held.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = l.Do(ctx, func(ctx context.Context) error {
					cfg.Work(ctx, l)
					return nil
				})
				held.Add(-1)
				select {
				case ended <- struct{}{}:
				default:
				}
			}()
		}
		switch {
		case err == nil:
			continue
		case ctx.Err() != nil:
			return context.Cause(ctx)
		case permanent(err):
			return err
		}
		// Not a connection failure (waitLoop waits those out) nor one
		// that retrying cannot fix.
		c.log.Warn("pgbaton: keep: claim failed; retrying", "group", cfg.Group, "error", err)
		if err := c.ln.Wait(ctx, ended, nil, c.cfg.RenewInterval); err != nil {
			return err
		}
	}
}
