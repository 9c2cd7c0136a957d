package leasetable

import (
	"context"
	"time"

	"github.com/pgbaton/pgbaton/internal/keep"
	"github.com/pgbaton/pgbaton/internal/listener"
	"github.com/pgbaton/pgbaton/internal/pgerr"
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
	return keep.Run(ctx, keep.Config[*Lease]{
		Max: cfg.Max,
		Claim: func(room func() int, woken <-chan struct{}) func() ([]*Lease, error) {
			q := want{kind: "group", name: cfg.Group, woken: woken, look: func(_ context.Context, w *listener.Waiter) ([]*Lease, error) {
				return c.once(ctx, spanClaim, telemetry.GroupKey, cfg.Group, func(ctx context.Context, start time.Time) ([]*Lease, error) {
					return c.claim(ctx, cfg.Group, room(), start, w, false)
				})
			}}
			return func() ([]*Lease, error) {
				got, _, err := c.waitLoop(ctx, q)
				return got, err
			}
		},
		Work: func(l *Lease) {
			_ = l.Do(ctx, func(ctx context.Context) error {
				cfg.Work(ctx, l)
				return nil
			})
		},
		Closed:    c.bg.Done(),
		Permanent: pgerr.Unfixable,
		Pause:     func(woken <-chan struct{}) error { return c.ln.Wait(ctx, woken, nil, c.cfg.RenewInterval) },
		Logger:    c.log.With("group", cfg.Group),
	})
}
