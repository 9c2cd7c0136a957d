package advisory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory/internal/pgsession"
)

// Lock is a held advisory lock. Watch Done (or Context) while working
// under it: it is closed when the lock stops being held, with Err saying
// why, ErrLockLost when its session died. A Lock is never reported as held
// once its session is gone.
type Lock struct {
	l      *Locker
	key    Key
	id     lockID
	shared bool
	sess   *session
	ctx    context.Context
	cancel context.CancelCauseFunc

	released  bool      // guarded by l.mu
	ended     bool      // its end was recorded in metrics; guarded by l.mu
	grantedAt time.Time // for the hold duration; zero when metrics are off
}

func (l *Locker) newLock(key Key, id lockID, shared bool, s *session) *Lock {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Lock{l: l, key: key, id: id, shared: shared, sess: s, ctx: ctx, cancel: cancel, grantedAt: l.metrics.start()}
}

// Key is the key the lock was taken with.
func (lk *Lock) Key() Key { return lk.key }

// Shared reports whether the lock is held in shared mode (RLock).
func (lk *Lock) Shared() bool { return lk.shared }

// Done is closed when the lock is no longer held: after Unlock, or when it
// was lost.
func (lk *Lock) Done() <-chan struct{} {
	lk.checkExpiry()
	return lk.ctx.Done()
}

// Context is cancelled when the lock is no longer held; context.Cause
// gives ErrUnlocked or an error wrapping ErrLockLost.
func (lk *Lock) Context() context.Context {
	lk.checkExpiry()
	return lk.ctx
}

// Err is nil while the lock is held, ErrUnlocked after Unlock, and an
// error wrapping ErrLockLost after the lock was lost.
func (lk *Lock) Err() error {
	lk.checkExpiry()
	if lk.ctx.Err() != nil {
		return context.Cause(lk.ctx)
	}
	return nil
}

// checkExpiry catches a session that stopped answering while its
// goroutine could not notice (a process paused past PingInterval +
// PingTimeout): such a lock must not look held.
func (lk *Lock) checkExpiry() {
	if lk.ctx.Err() == nil && lk.sess.Expired() {
		lk.sess.Abort(lk.sess.LostErr())
		<-lk.sess.exited // the Locker has cancelled the session's locks
	}
}

// Unlock releases the lock. Once Unlock is called the lock counts as
// released even if ctx ends first: the release still completes in the
// background, bounded by Config.PingTimeout. It returns an error wrapping
// ErrLockLost when the lock had been lost before (the work done under it
// was not protected to the end), and ErrNotHeld (nothing was changed) on
// a second Unlock or when the server no longer held the lock.
func (lk *Lock) Unlock(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", pgbaton.ErrInvalidArgument)
	}
	lk.checkExpiry()
	l := lk.l
	l.mu.Lock()
	if lk.released {
		l.mu.Unlock()
		return fmt.Errorf("%w: %s was unlocked already", ErrNotHeld, lk.key)
	}
	lk.released = true
	if lk.ctx.Err() != nil { // lost: the session took the lock with it
		l.mu.Unlock()
		return context.Cause(lk.ctx)
	}
	e := l.entries[lk.id]
	if e == nil || e.sess != lk.sess { // cannot happen: loss cancels first
		l.mu.Unlock()
		return fmt.Errorf("%w: %s: no longer tracked", ErrLockLost, lk.key)
	}
	delete(e.locks, lk)
	l.metrics.ended(lk, "")
	lk.cancel(ErrUnlocked)
	if len(e.locks) > 0 { // other shared holders in this process remain
		l.mu.Unlock()
		return nil
	}
	e.busy = true
	l.mu.Unlock()

	op := pgsession.Unlock
	if lk.shared {
		op = pgsession.UnlockShared
	}
	s := lk.sess
	ok, err := s.Do(op, lk.id)

	l.mu.Lock()
	e.busy = false
	delete(l.entries, lk.id)
	l.total--
	e.notify()
	l.mu.Unlock()
	l.unreserve(s)
	switch {
	case err != nil && errors.Is(err, ErrLockLost):
		return fmt.Errorf("advisory: unlock %s: %w", lk.key, err)
	case err != nil:
		return fmt.Errorf("advisory: unlock %s: %w", lk.key, err)
	case !ok:
		return fmt.Errorf("%w: the server did not hold %s on session pid %d", ErrNotHeld, lk.key, s.PID())
	}
	return nil
}
