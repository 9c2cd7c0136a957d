package advisory

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// XactTryLock takes the exclusive transaction-scoped lock on key in the
// caller's transaction, without waiting: ErrLocked when it is held. The
// lock is released when tx commits or rolls back, so it works behind
// PgBouncer transaction pooling, where session locks do not. The Locker's
// namespace and name registry apply; no session connection is used.
func (l *Locker) XactTryLock(ctx context.Context, tx pgx.Tx, key Key) error {
	return l.xact(ctx, tx, key, false, false)
}

// XactLock takes the exclusive transaction-scoped lock on key in tx,
// waiting until it is free or ctx ends (pgx then cancels the statement,
// and the transaction is aborted).
func (l *Locker) XactLock(ctx context.Context, tx pgx.Tx, key Key) error {
	return l.xact(ctx, tx, key, false, true)
}

// XactTryRLock is XactTryLock in shared mode.
func (l *Locker) XactTryRLock(ctx context.Context, tx pgx.Tx, key Key) error {
	return l.xact(ctx, tx, key, true, false)
}

// XactRLock is XactLock in shared mode.
func (l *Locker) XactRLock(ctx context.Context, tx pgx.Tx, key Key) error {
	return l.xact(ctx, tx, key, true, true)
}

func (l *Locker) xact(ctx context.Context, tx pgx.Tx, key Key, shared, wait bool) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", pgbaton.ErrInvalidArgument)
	}
	if tx == nil {
		return fmt.Errorf("%w: nil transaction", pgbaton.ErrInvalidArgument)
	}
	id, err := key.resolve(l.cfg.Namespace)
	if err != nil {
		return err
	}
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return fmt.Errorf("advisory: lock %s: %w", key, pgbaton.ErrClosed)
	}
	if key.kind == kindName {
		if err := l.register(ctx, key.name, id.id); err != nil {
			return err
		}
	}
	q := db.New()
	if !wait {
		ok, err := q.AdvisoryXactTry(ctx, tx, db.AdvisoryXactTryParams{Shared: shared, Pair: id.pair, Hi: id.hi, Lo: id.lo, Key: id.id})
		if err != nil {
			return mapError("transaction lock "+key.String(), err)
		}
		if !ok {
			return fmt.Errorf("%w: %s", ErrLocked, key)
		}
		return nil
	}
	switch {
	case id.pair && shared:
		err = q.AdvisoryXactLockPairShared(ctx, tx, db.AdvisoryXactLockPairSharedParams{Hi: id.hi, Lo: id.lo})
	case id.pair:
		err = q.AdvisoryXactLockPair(ctx, tx, db.AdvisoryXactLockPairParams{Hi: id.hi, Lo: id.lo})
	case shared:
		err = q.AdvisoryXactLockShared(ctx, tx, id.id)
	default:
		err = q.AdvisoryXactLock(ctx, tx, id.id)
	}
	return mapError("transaction lock "+key.String(), err)
}
