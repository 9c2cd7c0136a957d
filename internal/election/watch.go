package election

import (
	"context"
	"log/slog"
	"time"

	"github.com/pgbaton/pgbaton/internal/backoff"
)

// Waiter is a registration as an observer of an election
// (listener.Waiter): the database wakes it when a term begins or a leader
// is asked to resign; without a listen slot it polls instead.
type Waiter interface {
	Wait(ctx context.Context, d time.Duration, woken <-chan struct{}) error
}

// Follower is what Follow needs of the layer to follow an election's
// leaders.
type Follower[L any] struct {
	// Read reads the current leader, its term and how long it lasts
	// without renewal; ok is false when nobody leads.
	Read func(ctx context.Context) (leader L, term int64, remaining time.Duration, ok bool, err error)
	// TTL is the longest a look waits without a notification.
	TTL    time.Duration
	Closed <-chan struct{} // the client closed
	Logger *slog.Logger
}

// Follow sends on ch each leader it reads with a term larger than the
// last one sent (terms only grow, so no leader is sent after a newer
// one), looking again when w is woken, until ctx ends or the client
// closes. w was registered before Follow's first look: a term that begins
// after the look wakes it.
func Follow[L any](ctx context.Context, w Waiter, ch chan<- L, f Follower[L]) {
	var last int64
	outage := backoff.Outage()
	for {
		ld, term, remaining, ok, err := f.Read(ctx)
		// Until its expiry, the leader read is the leader: nothing new
		// without a notification. With nobody leading, the next term
		// notifies; looking again every TTL covers a notification lost
		// with a LISTEN connection.
		next := f.TTL
		switch {
		case err == nil && !ok:
			outage.Reset()
		case err == nil:
			outage.Reset()
			next = min(next, remaining)
			if term > last {
				select {
				case ch <- ld:
					last = term
				case <-ctx.Done():
					return
				case <-f.Closed:
					return
				}
			}
		default:
			if ctx.Err() != nil {
				return
			}
			f.Logger.Debug("pgbaton: observing an election: reading its leader failed", "error", err)
			next = outage.Next()
		}
		if w.Wait(ctx, next, nil) != nil {
			return
		}
	}
}

// Asked is a term's request to resign: its context ends when the term
// ends, or, with the request as its cause, when someone asks the leader
// to resign (Watch).
type Asked struct {
	ctx  context.Context
	ask  context.CancelCauseFunc
	done chan struct{} // closed on a request only
}

// NewAsked is the request to resign of the term whose context is term,
// not asked yet.
func NewAsked(term context.Context) *Asked {
	ctx, ask := context.WithCancelCause(term)
	return &Asked{ctx: ctx, ask: ask, done: make(chan struct{})}
}

// Context ends when the term ends or the leader is asked to resign, with
// the request as its cause: the term's work runs under it.
func (a *Asked) Context() context.Context { return a.ctx }

// Requested is closed when someone asked the leader to resign.
func (a *Asked) Requested() <-chan struct{} { return a.done }

// Reason is nil until Requested is closed, then the request.
func (a *Asked) Reason() error {
	select {
	case <-a.done:
		return context.Cause(a.ctx)
	default:
		return nil
	}
}

// ResignWatch is what Asked.Watch needs of the layer.
type ResignWatch[W Waiter] struct {
	// Join registers as an observer of the election; Leave ends the
	// registration.
	Join  func(ctx context.Context) (W, error)
	Leave func(W)
	// Look reads the request that this term resign: nil while there is
	// none.
	Look func(ctx context.Context) (request, err error)
	// Pause is the wait before Join is tried again after it failed.
	Pause  func(ctx context.Context) error
	TTL    time.Duration
	Logger *slog.Logger
}

// Watch waits for a request that the term resign, as an observer of its
// own election (woken by the request's notification, or at its poll when
// the client holds no listen slot; every TTL regardless, in case a
// notification was lost with a LISTEN connection), until the term ends
// (its context, term, is the one NewAsked was given) or Pause or Wait
// fail (the client closed). The request's first look comes after the
// registration, so a request made before it is seen too.
func Watch[W Waiter](term context.Context, a *Asked, rw ResignWatch[W]) {
	var w W
	joined := false
	defer func() {
		if joined {
			rw.Leave(w)
		}
	}()
	for term.Err() == nil {
		if !joined {
			var err error
			if w, err = rw.Join(term); err != nil {
				rw.Logger.Debug("pgbaton: leader cannot watch for requests to resign; trying again", "error", err)
				if rw.Pause(term) != nil {
					return
				}
				continue
			}
			joined = true
		}
		request, err := rw.Look(term)
		if err == nil && request != nil {
			a.ask(request)
			close(a.done)
			return
		}
		if err != nil && term.Err() == nil {
			rw.Logger.Debug("pgbaton: reading requests to resign failed", "error", err)
		}
		if w.Wait(term, rw.TTL, nil) != nil {
			return
		}
	}
}
