// Package keep is leasetable's Client.Keep loop: it holds up to Max
// leases of a group, running the work of each on its own goroutine, and
// claims again whenever it holds fewer. The layer gives it the claim (a
// wait in the group's queue), the work, and what ends it.
package keep

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/pgbaton/pgbaton"
)

// Config is what Run needs of the layer.
type Config[L any] struct {
	Max int
	// Claim returns the claim Run repeats: it waits until it claims at
	// least one lease and at most room() (room changes as leases end),
	// or fails; woken wakes its wait besides the group's queue (one of
	// the kept leases ended).
	Claim func(room func() int, woken <-chan struct{}) func() ([]L, error)
	// Work runs for one lease kept, on its own goroutine, and gives it
	// back when it returns.
	Work      func(L)
	Closed    <-chan struct{} // the client closed
	Permanent func(error) bool
	// Pause is the wait after a failed claim, cut short by woken.
	Pause  func(woken <-chan struct{}) error
	Logger *slog.Logger
}

// Run keeps leases until ctx ends: whenever it holds fewer than Max
// (nothing more was free, or a lease ended), it claims again. It returns
// ctx's cause once every Work has returned, or at once (also after the
// Works) an error that retrying cannot fix, pgbaton.ErrClosed when the
// client closed, or Pause's error.
func Run[L any](ctx context.Context, cfg Config[L]) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	var held atomic.Int64           // leases whose Work runs
	ended := make(chan struct{}, 1) // one of them ended: claim again
	claim := cfg.Claim(func() int { return cfg.Max - int(held.Load()) }, ended)
	for {
		// At Max only one of its own ending matters. It waits for that out
		// of the group's queue (the claim's wait left it with the grant),
		// so that a release's wake-up goes to a waiter that can use it.
		for held.Load() == int64(cfg.Max) {
			select {
			case <-ended:
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-cfg.Closed:
				return pgbaton.ErrClosed
			}
		}
		got, err := claim()
		for _, l := range got {
			held.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				cfg.Work(l)
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
		case cfg.Permanent(err):
			return err
		}
		// Not a connection failure (the claim waits those out) nor one
		// that retrying cannot fix.
		cfg.Logger.Warn("pgbaton: keep: claim failed; retrying", "error", err)
		if err := cfg.Pause(ended); err != nil {
			return err
		}
	}
}
