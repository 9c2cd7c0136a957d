package advisory

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/election"
	"github.com/pgbaton/pgbaton/internal/pgerr"
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

// Callbacks are Campaign's hooks, the same for both lock layers: term is
// always 0 here (advisory locks have no fencing token; use leases for
// fenced terms).
type Callbacks = pgbaton.Callbacks

// Campaign campaigns for key until ctx ends: it waits to become leader,
// runs OnStartedLeading for the term, and after the term ends (lost or
// OnStartedLeading returned) campaigns again after a pause of about 100 ms
// (after Config.RetryDelay when the election failed). Terms in this process never
// overlap: OnStoppedLeading has run before the next OnStartedLeading. It
// returns the context's cause when ctx ends, or at once for errors
// retrying cannot fix (bad input, Locker closed, standby, transaction
// pooling, name collision). The loop is the one leasetable's Campaign
// runs.
func (l *Locker) Campaign(ctx context.Context, key Key, cb Callbacks) error {
	if ctx == nil || cb.OnStartedLeading == nil {
		return fmt.Errorf("%w: Campaign needs a context and Callbacks.OnStartedLeading", pgbaton.ErrInvalidArgument)
	}
	if _, err := key.resolve(l.cfg.Namespace); err != nil {
		return err
	}
	return election.Campaign(ctx, elector{l, key}, cb, election.Config{
		Retry: l.cfg.RetryDelay, Permanent: permanent, Logger: l.cfg.Logger, What: key.String(),
	})
}

// elector is a Locker electing on one key, for the shared campaign loop.
type elector struct {
	l   *Locker
	key Key
}

func (e elector) Elect(ctx context.Context) (election.Term, error) {
	ld, err := e.l.Elect(ctx, e.key)
	if err != nil {
		return nil, err
	}
	return term{ld}, nil
}

type term struct{ *Leadership }

func (term) Number() int64 { return 0 }

// permanent is pgerr.Unfixable and advisory's own errors that retrying
// cannot fix.
func permanent(err error) bool {
	return pgerr.Unfixable(err) || errors.Is(err, ErrSessionPooling) || errors.Is(err, ErrKeyCollision)
}
