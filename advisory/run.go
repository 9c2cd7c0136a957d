package advisory

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgbaton/pgbaton"
)

// RunOptions configures RunExclusive.
type RunOptions struct {
	// Wait makes RunExclusive wait for the lock (until ctx ends) instead of
	// returning ErrLocked when it is held. Default false: skip if held, so
	// that no two nodes run fn at once. That alone does not run a cron job
	// once per scheduled slot: a node whose ticker fires after another
	// node's run has ended runs the slot again. Claim the slot with
	// jobs.ClaimSlot first (package doc, "Cron jobs").
	Wait bool
	// Shared takes the lock in shared mode (readers), default exclusive.
	Shared bool
}

// RunExclusive runs fn while holding the lock on key, and unlocks on every
// path, a panic in fn included (the panic continues after the unlock).
// fn's context is cancelled when ctx ends or the lock is lost; then
// context.Cause gives an error wrapping ErrLockLost. If the lock was lost
// before fn returned, RunExclusive returns an error wrapping ErrLockLost
// (joined with fn's error), even if fn returned nil: the work was not
// protected to its end, so do not acknowledge it.
//
// With the zero RunOptions, a key held elsewhere returns ErrLocked and fn
// does not run.
func (l *Locker) RunExclusive(ctx context.Context, key Key, fn func(ctx context.Context) error, opts RunOptions) (err error) {
	if fn == nil {
		return fmt.Errorf("%w: nil function", pgbaton.ErrInvalidArgument)
	}
	var lk *Lock
	switch {
	case opts.Wait && opts.Shared:
		lk, err = l.RLock(ctx, key)
	case opts.Wait:
		lk, err = l.Lock(ctx, key)
	case opts.Shared:
		lk, err = l.TryRLock(ctx, key)
	default:
		lk, err = l.TryLock(ctx, key)
	}
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(lk.Context(), func() { cancel(context.Cause(lk.Context())) })
	defer func() {
		stop()
		cancel(nil)
		lostErr := lk.Err()
		if lostErr != nil && !errors.Is(lostErr, ErrLockLost) {
			lostErr = nil
		}
		unlockErr := lk.Unlock(context.WithoutCancel(ctx))
		if errors.Is(unlockErr, ErrLockLost) {
			unlockErr = nil // reported as lostErr
		}
		err = errors.Join(err, lostErr, unlockErr)
	}()
	return fn(fctx)
}
