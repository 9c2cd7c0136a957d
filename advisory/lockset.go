package advisory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/lockset"
	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// MaxSetKeys bounds the keys of one lock set (LockAll, TryLockAll,
// XactLockAll, XactTryLockAll).
const MaxSetKeys = 1000

// LockSet is exclusive locks taken together by LockAll or TryLockAll:
// every key of the set. The locks live and end one by one, as any Lock
// does; the set's Context ends when the first of them ends. Its methods
// are safe for concurrent use.
type LockSet struct {
	locks []*Lock // in the order taken (setOrder)
	ends  *lockset.Ends[*Lock]
}

// Locks are the set's locks in the order they were taken.
func (s *LockSet) Locks() []*Lock { return slices.Clone(s.locks) }

// Err is nil while every lock of the set is held, then the Err of the
// first that ended (ErrUnlocked, or an error wrapping ErrLockLost).
func (s *LockSet) Err() error { return s.ends.Err() }

// Done is closed when the first lock of the set ends.
func (s *LockSet) Done() <-chan struct{} { return s.ends.Done() }

// Context is cancelled when the first lock of the set ends, with that
// lock's Err as its cause: run work that needs the whole set under it.
func (s *LockSet) Context() context.Context { return s.ends.Context() }

// Unlock releases every lock of the set, in the reverse of the order they
// were taken, as Lock.Unlock releases one; locks unlocked before are
// skipped. It returns the locks' errors joined: ErrLockLost for a lock
// lost before (the work was not protected to the end).
func (s *LockSet) Unlock(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", pgbaton.ErrInvalidArgument)
	}
	return unlockAll(ctx, s.locks)
}

// unlockAll unlocks locks in the reverse of the order they were taken.
func unlockAll(ctx context.Context, locks []*Lock) error {
	var errs []error
	for _, lk := range slices.Backward(locks) {
		if err := lk.Unlock(ctx); err != nil && !errors.Is(err, ErrNotHeld) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func newLockSet(locks []*Lock) *LockSet {
	return &LockSet{locks: locks, ends: lockset.Watch(locks, func(lk *Lock) context.Context { return lk.ctx })}
}

// setOrder checks the keys of a set and returns them in the one order
// every set is taken in: bigint keys (Name, Int64) first, by the bigint
// Postgres sees (for a name, pgbaton.advisory_key(name, namespace)), then
// pairs by (hi, lo). Two keys that are one lock (a name and its Int64) are
// refused as a key given twice.
func (l *Locker) setOrder(ctx context.Context, keys []Key) ([]Key, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", pgbaton.ErrInvalidArgument)
	}
	if len(keys) == 0 || len(keys) > MaxSetKeys {
		return nil, fmt.Errorf("%w: a lock set must have 1 to %d keys, got %d", pgbaton.ErrInvalidArgument, MaxSetKeys, len(keys))
	}
	type resolved struct {
		key Key
		id  lockID
	}
	rs := make([]resolved, len(keys))
	for i, k := range keys {
		id, err := k.resolve(l.cfg.Namespace)
		if err != nil {
			return nil, err
		}
		rs[i] = resolved{k, id}
	}
	order := func(a, b lockID) int {
		if a.Pair != b.Pair {
			if b.Pair {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(a.ID, b.ID), cmp.Compare(a.Hi, b.Hi), cmp.Compare(a.Lo, b.Lo))
	}
	slices.SortFunc(rs, func(a, b resolved) int { return order(a.id, b.id) })
	sorted := make([]Key, len(rs))
	for i, r := range rs {
		if i > 0 && order(rs[i-1].id, r.id) == 0 {
			return nil, fmt.Errorf("%w: %s and %s are one lock, given twice in a lock set", pgbaton.ErrInvalidArgument, rs[i-1].key, r.key)
		}
		sorted[i] = r.key
	}
	return sorted, nil
}

// LockAll takes the exclusive locks on every key, or none, waiting while
// any is held. The keys are taken one after another in one order (bigint
// keys by value, then pairs; see the package doc, "Lock sets"), holding
// those before: every caller takes its keys in that order, so no two sets
// wait for each other in a cycle ({a, b} and {b, a} never deadlock). When
// it fails (ctx ended, the Locker closed, a connection failed), the locks
// it had taken are unlocked before it returns. An empty set, a key given
// twice, an invalid key or more than MaxSetKeys keys are refused
// (pgbaton.ErrInvalidArgument) before anything is locked.
func (l *Locker) LockAll(ctx context.Context, keys ...Key) (*LockSet, error) {
	return l.lockAll(ctx, keys, true)
}

// TryLockAll takes the exclusive locks on every key if all are free, in
// LockAll's order, without waiting: when one is held it unlocks those it
// took and returns ErrLocked.
func (l *Locker) TryLockAll(ctx context.Context, keys ...Key) (*LockSet, error) {
	return l.lockAll(ctx, keys, false)
}

func (l *Locker) lockAll(ctx context.Context, keys []Key, wait bool) (*LockSet, error) {
	sorted, err := l.setOrder(ctx, keys)
	if err != nil {
		return nil, err
	}
	locks := make([]*Lock, 0, len(sorted))
	for _, k := range sorted {
		lk, err := l.acquire(ctx, k, false, wait)
		if err != nil {
			_ = unlockAll(context.WithoutCancel(ctx), locks)
			return nil, fmt.Errorf("advisory: lock set: %w", err)
		}
		locks = append(locks, lk)
	}
	return newLockSet(locks), nil
}

// XactLockAll takes the exclusive transaction-scoped locks on every key in
// tx, or none, waiting while any is held: in LockAll's order, after a
// savepoint. If any fails (ctx ended, a collision, a connection failure)
// the transaction is rolled back to the savepoint, which releases the
// locks of the set it took, and stays usable when the connection does.
// The locks are released when tx commits or rolls back. Bad input is
// refused as LockAll refuses it, before anything is sent.
func (l *Locker) XactLockAll(ctx context.Context, tx pgbaton.Tx, keys ...Key) error {
	return l.xactAll(ctx, tx, keys, true)
}

// XactTryLockAll is XactLockAll without the wait: when one key is held it
// releases those of the set it took (rolling back to its savepoint) and
// returns ErrLocked, leaving tx usable.
func (l *Locker) XactTryLockAll(ctx context.Context, tx pgbaton.Tx, keys ...Key) error {
	return l.xactAll(ctx, tx, keys, false)
}

// setSavepoint is the savepoint a transaction-scoped set is taken after.
const setSavepoint = "pgbaton_lock_set"

func (l *Locker) xactAll(ctx context.Context, tx pgbaton.Tx, keys []Key, wait bool) error {
	sorted, err := l.setOrder(ctx, keys)
	if err != nil {
		return err
	}
	if tx == nil {
		return fmt.Errorf("%w: nil transaction", pgbaton.ErrInvalidArgument)
	}
	if _, err := tx.Exec(ctx, "SAVEPOINT "+setSavepoint); err != nil {
		return mapError("lock set: savepoint", err)
	}
	sctx, stop := cancelOnServer(ctx, tx, wait, l.cfg.PingTimeout)
	for _, k := range sorted {
		if err = l.xact(sctx, tx, k, false, wait); err != nil {
			break
		}
	}
	if !stop() && err == nil {
		// ctx ended as the last lock was granted: the cancel request may
		// still reach the server, so the set is given up.
		err = fmt.Errorf("advisory: lock set: %w", context.Cause(ctx))
	}
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w: %w", context.Cause(ctx), err) // the server's "canceled" says less
		}
		return l.rollbackSet(ctx, tx, err)
	}
	if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT "+setSavepoint); err != nil {
		return mapError("lock set: release savepoint", err)
	}
	return nil
}

// rollbackSet gives up a transaction-scoped set that failed with err:
// back to the savepoint, which releases the set's locks and ends an
// aborted state. Sent even when ctx has ended: the transaction is the
// caller's, and must be left without the set's locks. Sent twice when a
// late cancel request (cancelOnServer) cancelled the first.
func (l *Locker) rollbackSet(ctx context.Context, tx pgbaton.Tx, err error) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.PingTimeout+time.Second)
	defer cancel()
	var rerr error
	for range 2 {
		if _, rerr = tx.Exec(rctx, "ROLLBACK TO SAVEPOINT "+setSavepoint); pgerr.Code(rerr) != pgerr.QueryCanceled {
			break
		}
	}
	if rerr != nil {
		return fmt.Errorf("advisory: lock set: %w (and rolling back to the savepoint failed: %w)", err, rerr)
	}
	_, _ = tx.Exec(rctx, "RELEASE SAVEPOINT "+setSavepoint)
	return fmt.Errorf("advisory: lock set: %w", err)
}

// cancelOnServer returns the context a waiting set's statements run on.
// For a pgx transaction it is one ctx does not end: when ctx ends, a
// cancel request stops the waiting statement on the server instead, so
// the transaction keeps its connection and can roll back to the set's
// savepoint. (Ending the statement's own context would have pgx close the
// connection, while the backend, which does not notice that while it
// waits for a lock, kept the set's locks taken so far until its wait
// ended.) stop reports false when ctx has ended (the request was sent, or
// is being sent: stop waits for it). Other transactions (database/sql)
// run on ctx.
func cancelOnServer(ctx context.Context, tx pgbaton.Tx, wait bool, timeout time.Duration) (context.Context, func() bool) {
	c, ok := tx.(interface{ Conn() *pgx.Conn })
	if !wait || !ok || ctx.Done() == nil {
		return ctx, func() bool { return ctx.Err() == nil }
	}
	sent := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() {
		defer close(sent)
		cctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_ = c.Conn().PgConn().CancelRequest(cctx)
	})
	return context.WithoutCancel(ctx), func() bool {
		if stopAfter() {
			return true
		}
		<-sent
		return false
	}
}
