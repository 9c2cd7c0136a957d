package leasetable

import (
	"context"
	"sync"
	"time"

	"github.com/pgbaton/pgbaton"
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
// are taken over at their expiry. It returns ctx's cause once every Work
// has returned and its lease is released, or at once an error that
// retrying cannot fix.
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
	w, err := c.startWaiting(ctx, cfg.Group, true, false)
	if err != nil {
		return err
	}
	defer w.stop()

	var wg sync.WaitGroup
	defer wg.Wait()
	ended := make(chan struct{}, cfg.Max) // one send per lease, at most Max live
	held := 0
	for {
		var retry time.Duration
		if held < cfg.Max {
			got, err := c.Claim(ctx, cfg.Group, cfg.Max-held)
			switch {
			case ctx.Err() != nil:
				return context.Cause(ctx)
			case err != nil && permanent(err):
				return err
			case err != nil:
				c.log.Warn("pgbaton: keep: claim failed; retrying", "group", cfg.Group, "error", err)
				retry = c.cfg.RenewInterval
			}
			for _, l := range got {
				held++
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = l.Do(ctx, func(ctx context.Context) error {
						cfg.Work(ctx, l)
						return nil
					})
					ended <- struct{}{}
				}()
			}
		}
		// Holding Max, only an ended lease matters; else also releases and
		// expiries in the group.
		var timer <-chan time.Time // collected unfired (Go 1.23)
		if held < cfg.Max {
			if retry == 0 {
				if retry, err = c.nextClaimable(ctx, cfg.Group); err != nil {
					retry = c.cfg.RenewInterval
				}
			}
			timer = time.After(c.waitFor(w.paced(retry))) // as every waiter: see Client.wait
		}
		select {
		case <-ended:
			held--
		case <-w.wake:
		case <-timer:
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-c.bg.Done():
			return pgbaton.ErrClosed
		}
	}
}
