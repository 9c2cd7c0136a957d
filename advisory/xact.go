package advisory

import (
	"context"
	"fmt"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// XactTryLock takes the exclusive transaction-scoped lock on key in the
// caller's transaction, without waiting: ErrLocked when it is held. The
// lock is released when tx commits or rolls back, so it works behind
// PgBouncer transaction pooling, where session locks do not. The Locker's
// namespace and name registry apply; every statement runs in tx, none on
// another connection (see the package documentation, "Transaction-scoped
// locks").
func (l *Locker) XactTryLock(ctx context.Context, tx pgbaton.Tx, key Key) error {
	return l.xact(ctx, tx, key, false, false)
}

// XactLock takes the exclusive transaction-scoped lock on key in tx,
// waiting until it is free or ctx ends (pgx then cancels the statement,
// and the transaction is aborted).
func (l *Locker) XactLock(ctx context.Context, tx pgbaton.Tx, key Key) error {
	return l.xact(ctx, tx, key, false, true)
}

// XactTryRLock is XactTryLock in shared mode.
func (l *Locker) XactTryRLock(ctx context.Context, tx pgbaton.Tx, key Key) error {
	return l.xact(ctx, tx, key, true, false)
}

// XactRLock is XactLock in shared mode.
func (l *Locker) XactRLock(ctx context.Context, tx pgbaton.Tx, key Key) error {
	return l.xact(ctx, tx, key, true, true)
}

func (l *Locker) xact(ctx context.Context, tx pgbaton.Tx, key Key, shared, wait bool) error {
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
	_, recorded := l.names[key.name]
	l.mu.Unlock()
	if closed {
		return fmt.Errorf("advisory: lock %s: %w", key, pgbaton.ErrClosed)
	}
	op := "transaction lock " + key.String()
	if key.kind == kindName && !recorded {
		err = l.xactName(ctx, tx, key, id.ID, shared, wait)
	} else {
		err = l.xactKey(ctx, tx, key, id, shared, wait)
	}
	if err != nil {
		l.logRefusal(op, err)
	}
	return err
}

// xactKey takes the lock in one statement, which also refuses a standby.
func (l *Locker) xactKey(ctx context.Context, tx pgbaton.Tx, key Key, id lockID, shared, wait bool) error {
	op := "transaction lock " + key.String()
	row, err := db.New().AdvisoryXactLock(ctx, tx, db.AdvisoryXactLockParams{
		Wait: wait, Shared: shared, Pair: id.Pair, Hi: id.Hi, Lo: id.Lo, Key: id.ID,
	})
	switch {
	case err != nil:
		return mapError(op, err)
	case row.Standby:
		return fmt.Errorf("advisory: %s: %w", op, pgbaton.ErrStandby)
	case !row.Ok:
		return fmt.Errorf("%w: %s", ErrLocked, key)
	}
	return nil
}

// xactName locks a name this Locker has not yet seen recorded in
// pgbaton.advisory_name, and records it, all in tx. One statement reads
// the recorded name and locks only if it is this one or none, so a
// collision is refused before anything is locked. A name not yet recorded
// is then inserted in tx, but only under an exclusive lock: no other
// transaction can then be inserting it, so the insert never waits, and an
// insert that conflicts does nothing and locks no row that later lockers
// would wait for. Under a shared lock, or in a read-only transaction, the
// name is left for a later exclusive or session lock to record.
//
// The Locker remembers a name once it reads it back as recorded, never
// right after inserting it: the caller may still roll back.
//
// Recording the name is not wrapped in a savepoint: the only ways it can
// fail are a missing schema or privilege, which need fixing rather than
// working around, while a savepoint would cost two more round trips and a
// subtransaction on the first lock of every name.
func (l *Locker) xactName(ctx context.Context, tx pgbaton.Tx, key Key, id int64, shared, wait bool) error {
	op := "transaction lock " + key.String()
	ns := l.cfg.Namespace
	q := db.New()
	row, err := q.AdvisoryXactLockName(ctx, tx, db.AdvisoryXactLockNameParams{
		Wait: wait, Shared: shared, Key: id, Name: key.name, Namespace: ns,
	})
	switch {
	case err != nil:
		return registryError(op, err)
	case row.Standby:
		return fmt.Errorf("advisory: %s: %w", op, pgbaton.ErrStandby)
	case row.RecordedName != "" && (row.RecordedName != key.name || row.RecordedNamespace != ns):
		return collision(key.name, ns, row.RecordedName, row.RecordedNamespace, id)
	case !row.Ok:
		return fmt.Errorf("%w: %s", ErrLocked, key)
	case row.RecordedName != "":
		l.remember(key.name)
		return nil
	case shared || row.ReadOnly:
		return nil
	}
	keys, err := q.AdvisoryXactRecordName(ctx, tx, db.AdvisoryXactRecordNameParams{Name: key.name, Namespace: ns})
	if err != nil {
		// tx is aborted, as by any failed statement; its lock goes with it.
		return registryError(fmt.Sprintf("record lock name %q", key.name), err)
	}
	if len(keys) == 1 && keys[0] != id {
		return fmt.Errorf("advisory: pgbaton.advisory_key(%q) = %d in SQL but %d in Go; the function was changed", key.name, keys[0], id)
	}
	return nil
}
