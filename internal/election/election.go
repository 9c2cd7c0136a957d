// Package election is the leader-election loop both lock layers share:
// advisory.Locker.Campaign and leasetable.Client.Campaign are this loop
// over their own Elect, so terms, callbacks, retries and what happens on
// loss are the same in both.
//
// The rest is the machinery of leasetable's elections, which are leases:
// a candidacy (rank, or never leading) and the lease metadata it is
// published in, following the leaders of an election (Follow), and a
// leader's request to resign (Asked, Watch).
package election

import (
	"context"
	"log/slog"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/backoff"
)

// AfterTerm is the pause after a term before campaigning again: a leader
// whose work returns at once does not spin, and the other candidates,
// woken by the resignation, get there first.
const AfterTerm = 100 * time.Millisecond

// Term is one leadership won by an Elector.
type Term interface {
	// Context ends when leadership ends: lost, or resigned; its cause says
	// which.
	Context() context.Context
	// Number is the term: the lease's fencing token, or 0 where the layer
	// has none (advisory locks).
	Number() int64
	// Resign gives leadership up.
	Resign(ctx context.Context) error
}

// Elector wins leadership: Elect blocks until it does or ctx ends.
type Elector interface {
	Elect(ctx context.Context) (Term, error)
}

// ElectFunc is an Elector that is one function.
type ElectFunc func(ctx context.Context) (Term, error)

// Elect calls f.
func (f ElectFunc) Elect(ctx context.Context) (Term, error) { return f(ctx) }

// Config is the loop's configuration from the layer.
type Config struct {
	// Retry is the pause (jittered by ±25%) after an election that failed.
	Retry time.Duration
	// Permanent tells errors retrying cannot fix; Campaign returns them.
	Permanent func(error) bool
	Logger    *slog.Logger
	What      string // for the log, e.g. `election "x"`
}

// Campaign campaigns until ctx ends: it waits to become leader, runs
// OnStartedLeading for the term with a context that ends when leadership
// is lost or ctx ends, resigns when it returns, runs OnStoppedLeading, and
// campaigns again after AfterTerm (after Retry when the election failed). Terms never overlap: OnStoppedLeading has
// run before the next OnStartedLeading. It returns ctx's cause when ctx
// ends, or at once an error Permanent says retrying cannot fix.
func Campaign(ctx context.Context, e Elector, cb pgbaton.Callbacks, cfg Config) error {
	for {
		t, err := e.Elect(ctx)
		switch {
		case ctx.Err() != nil:
			if err == nil {
				_ = t.Resign(context.WithoutCancel(ctx))
			}
			return context.Cause(ctx)
		case err != nil && cfg.Permanent(err):
			return err
		case err != nil:
			cfg.Logger.Warn("pgbaton: campaign: election failed; retrying", "election", cfg.What, "error", err)
			if !backoff.Sleep(ctx, backoff.Jitter(cfg.Retry)) {
				return context.Cause(ctx)
			}
		default:
			term(ctx, t, cb)
			if !backoff.Sleep(ctx, backoff.Jitter(AfterTerm)) {
				return context.Cause(ctx)
			}
		}
	}
}

// term runs one term and ends it: resigned (a no-op if lost) and
// OnStoppedLeading called, on every path, a panic in OnStartedLeading
// included.
func term(ctx context.Context, t Term, cb pgbaton.Callbacks) {
	tctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(t.Context(), func() { cancel(context.Cause(t.Context())) })
	defer func() {
		stop()
		cancel(nil)
		_ = t.Resign(context.WithoutCancel(ctx))
		if cb.OnStoppedLeading != nil {
			cb.OnStoppedLeading()
		}
	}()
	cb.OnStartedLeading(tctx, t.Number())
}
