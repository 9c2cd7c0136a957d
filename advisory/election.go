package advisory

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pgbaton/pgbaton"
)

// Leadership is won by Elect: this process leads while it holds the
// exclusive lock on the election's key.
type Leadership struct {
	lock *Lock
}

// Elect blocks until this process is the leader for key (holds its
// exclusive lock) or ctx ends.
func (l *Locker) Elect(ctx context.Context, key Key) (*Leadership, error) {
	lk, err := l.Lock(ctx, key)
	if err != nil {
		return nil, err
	}
	return &Leadership{lock: lk}, nil
}

// Done is closed when leadership ends: resigned or lost.
func (ld *Leadership) Done() <-chan struct{} { return ld.lock.Done() }

// Context is cancelled when leadership ends; its cause wraps ErrLockLost
// when it was lost.
func (ld *Leadership) Context() context.Context { return ld.lock.Context() }

// Err is nil while leading, like Lock.Err otherwise.
func (ld *Leadership) Err() error { return ld.lock.Err() }

// Resign gives up leadership, letting another candidate win.
func (ld *Leadership) Resign(ctx context.Context) error { return ld.lock.Unlock(ctx) }

// Callbacks are Campaign's hooks.
type Callbacks struct {
	// OnStartedLeading runs, on Campaign's goroutine, each time this
	// process becomes leader. Its context is cancelled when leadership is lost or
	// Campaign's context ends. Leadership is kept until it returns (or is
	// lost), then resigned. Required.
	OnStartedLeading func(ctx context.Context)
	// OnStoppedLeading runs after each term, once OnStartedLeading has
	// returned and leadership was resigned or lost. Optional.
	OnStoppedLeading func()
}

// Campaign campaigns for key until ctx ends: it waits to become leader,
// runs OnStartedLeading for the term, and after the term ends (lost or
// OnStartedLeading returned) campaigns again after Config.RetryDelay
// (jittered), the same pause as after errors. Terms in this process never overlap: OnStoppedLeading has
// run before the next OnStartedLeading. It returns the context's cause
// when ctx ends, or at once for errors retrying cannot fix (bad input,
// Locker closed, standby, transaction pooling, name collision).
func (l *Locker) Campaign(ctx context.Context, key Key, cb Callbacks) error {
	if ctx == nil || cb.OnStartedLeading == nil {
		return fmt.Errorf("%w: Campaign needs a context and Callbacks.OnStartedLeading", pgbaton.ErrInvalidArgument)
	}
	if _, err := key.resolve(l.cfg.Namespace); err != nil {
		return err
	}
	for {
		ld, err := l.Elect(ctx, key)
		switch {
		case ctx.Err() != nil:
			if ld != nil {
				_ = ld.Resign(context.WithoutCancel(ctx))
			}
			return context.Cause(ctx)
		case err != nil && permanent(err):
			return err
		case err != nil:
			l.cfg.Logger.Warn("advisory: campaign: election failed; retrying", "key", key.String(), "err", err)
			if !sleep(ctx, jitter(l.cfg.RetryDelay)) {
				return context.Cause(ctx)
			}
			continue
		}
		l.term(ctx, ld, cb)
		// Pause before the next campaign, lost or not: a leader whose
		// OnStartedLeading returns at once must not spin, and others get
		// their chance.
		if ctx.Err() != nil || !sleep(ctx, jitter(l.cfg.RetryDelay)) {
			return context.Cause(ctx)
		}
	}
}

func (l *Locker) term(ctx context.Context, ld *Leadership, cb Callbacks) {
	tctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(ld.Context(), func() { cancel(context.Cause(ld.Context())) })
	defer func() {
		stop()
		cancel(nil)
		_ = ld.Resign(context.WithoutCancel(ctx))
		if cb.OnStoppedLeading != nil {
			cb.OnStoppedLeading()
		}
	}()
	cb.OnStartedLeading(tctx)
}

func permanent(err error) bool {
	for _, p := range []error{pgbaton.ErrInvalidArgument, pgbaton.ErrClosed, pgbaton.ErrStandby, ErrSessionPooling, ErrKeyCollision, pgbaton.ErrNotMigrated} {
		if errors.Is(err, p) {
			return true
		}
	}
	return false
}

func jitter(d time.Duration) time.Duration {
	return d*3/4 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
