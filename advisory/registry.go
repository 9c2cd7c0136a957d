package advisory

import (
	"context"
	"fmt"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// registerLockTimeout bounds how long register waits for a transaction
// that is recording the same name (XactLock records a name in the
// caller's transaction, which may stay open for long): past it, register
// leaves the name to that transaction instead of waiting for it.
const registerLockTimeout = "100ms"

// register records name in pgbaton.advisory_name for session locks, once
// per Locker and name, and reports a collision: another name stored with
// the same key. It also checks that Go and SQL agree on the key. It runs
// on the pool.
func (l *Locker) register(ctx context.Context, name string, key int64) error {
	l.mu.Lock()
	_, done := l.names[name]
	l.mu.Unlock()
	if done {
		return nil
	}
	ns := l.cfg.Namespace
	row, err := db.New().AdvisoryRegisterName(ctx, l.pool, db.AdvisoryRegisterNameParams{
		Name: name, Namespace: ns, LockTimeout: registerLockTimeout,
	})
	if pgerr.Code(err) == pgerr.LockNotAvailable { // lock_timeout
		// An open transaction is recording this key; it checked for
		// collisions itself. Try again at the next lock.
		return nil
	}
	if err != nil {
		return registryError(fmt.Sprintf("record lock name %q", name), err)
	}
	if row.Name != name || row.Namespace != ns {
		return collision(name, ns, row.Name, row.Namespace, key)
	}
	if row.Key != key {
		return fmt.Errorf("advisory: pgbaton.advisory_key(%q) = %d in SQL but %d in Go; the function was changed", name, row.Key, key)
	}
	l.remember(name)
	return nil
}

// remember notes that name is recorded, so this Locker does not record it
// again.
func (l *Locker) remember(name string) {
	l.mu.Lock()
	l.names[name] = struct{}{}
	l.mu.Unlock()
}

func collision(name, ns, otherName, otherNS string, key int64) error {
	return fmt.Errorf("%w: %q (namespace %q) and %q (namespace %q) both map to key %d; rename one", ErrKeyCollision, name, ns, otherName, otherNS, key)
}

// registryError maps an error from a statement on pgbaton.advisory_name.
func registryError(op string, err error) error {
	if pgerr.Shared(err) == pgbaton.ErrNotMigrated {
		op += " (advisory lock names need pgbaton.advisory_name, migration 2)"
	}
	return mapError(op, err)
}
