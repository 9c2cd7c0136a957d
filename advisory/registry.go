package advisory

import (
	"context"
	"fmt"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// register records name in pgbaton.advisory_name, once per Locker and
// name, and reports a collision: another name stored with the same key.
// It also checks that Go and SQL agree on the key.
func (l *Locker) register(ctx context.Context, name string, key int64) error {
	l.mu.Lock()
	_, done := l.names[name]
	l.mu.Unlock()
	if done {
		return nil
	}
	ns := l.cfg.Namespace
	row, err := db.New().AdvisoryRegisterName(ctx, l.pool, db.AdvisoryRegisterNameParams{Name: name, Namespace: ns})
	switch pgCode(err) {
	case "":
	case sqlstateReadOnlyTransaction:
		return fmt.Errorf("advisory: record lock name %q: %w: %w", name, pgbaton.ErrStandby, err)
	case sqlstateUndefinedTable, sqlstateUndefinedFunction, sqlstateInvalidSchema:
		return fmt.Errorf("%w: advisory lock names need pgbaton.advisory_name (migration 2): run `pgbaton migrate up` or migrations.Up: %w", pgbaton.ErrNotMigrated, err)
	}
	if err != nil {
		return mapError(fmt.Sprintf("record lock name %q", name), err)
	}
	if row.Name != name || row.Namespace != ns {
		return fmt.Errorf("%w: %q (namespace %q) and %q (namespace %q) both map to key %d; rename one", ErrKeyCollision, name, ns, row.Name, row.Namespace, key)
	}
	if row.Key != key {
		return fmt.Errorf("advisory: pgbaton.advisory_key(%q) = %d in SQL but %d in Go; the function was changed", name, row.Key, key)
	}
	l.mu.Lock()
	l.names[name] = struct{}{}
	l.mu.Unlock()
	return nil
}
