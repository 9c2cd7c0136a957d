package fencedwrite

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// Lease is a granted lease as fencedwrite needs it: its name and its
// fencing token. A leasetable lease satisfies it; Token builds one from
// plain values.
type Lease interface {
	Name() string
	Token() int64
}

// Token returns a Lease for name and token, for callers that keep the pair
// themselves (for example a token passed along in a message).
func Token(name string, token int64) Lease { return tokenLease{name, token} }

type tokenLease struct {
	name  string
	token int64
}

func (l tokenLease) Name() string   { return l.name }
func (l tokenLease) Token() int64   { return l.token }
func (l tokenLease) String() string { return fmt.Sprintf("%s#%d", l.name, l.token) }

// Guard checks, inside tx, that the lease name is held with exactly token
// and has not expired by the database clock, and locks the lease row FOR
// SHARE until tx ends. Until then no takeover, renewal or release of the
// lease can commit, so every write tx makes after a successful Guard
// commits while the lease is still this token's, or not at all.
//
// When the token is stale the error is a *StaleTokenError (errors.Is
// ErrStaleToken) and tx is aborted: PostgreSQL refuses every further
// statement and COMMIT turns into ROLLBACK, so a caller that ignores the
// error still cannot write under the stale token. Roll back and stop.
//
// Call Guard before the transaction's writes. It assumes READ COMMITTED
// (see the package documentation for other isolation levels).
func Guard(ctx context.Context, tx pgbaton.Tx, name string, token int64) error {
	if err := checkGuardArgs(tx, name, token); err != nil {
		return err
	}
	row, err := db.New().FenceAssertToken(ctx, tx, db.FenceAssertTokenParams{Name: name, Token: token})
	if err == nil && row.Standby {
		return standbyGuard(name)
	}
	return guardError(ctx, tx, name, token, err)
}

// standbyGuard is the error of a guard that found the server in recovery.
func standbyGuard(name string) error {
	return fmt.Errorf("%w: fencing guard for lease %q: fenced writes need the primary", pgbaton.ErrStandby, name)
}

// GuardLease is Guard for a Lease.
func GuardLease(ctx context.Context, tx pgbaton.Tx, lease Lease) error {
	if isNil(lease) {
		return fmt.Errorf("%w: nil lease", pgbaton.ErrInvalidArgument)
	}
	return Guard(ctx, tx, lease.Name(), lease.Token())
}

func checkGuardArgs(tx pgbaton.Tx, name string, token int64) error {
	if isNil(tx) {
		return fmt.Errorf("%w: nil transaction; Guard works inside the transaction that writes", pgbaton.ErrInvalidArgument)
	}
	return checkToken(name, token)
}

func checkToken(name string, token int64) error {
	if name == "" || len(name) > maxName {
		return fmt.Errorf("%w: lease name must be 1 to %d bytes, got %d", pgbaton.ErrInvalidArgument, maxName, len(name))
	}
	return positive(token)
}

func positive(token int64) error {
	if token <= 0 {
		return fmt.Errorf("%w: fencing token must be positive, got %d", pgbaton.ErrInvalidArgument, token)
	}
	return nil
}

// maxName is the longest lease name or value key, in bytes, as the lease
// and fenced_value tables check.
const maxName = 255

// guardError maps the guard query's error, which q ran: PB001 to a
// *StaleTokenError (filling in what the caller presented if the detail was
// unreadable), a standby to pgbaton.ErrStandby, everything else wrapped
// with what failed.
func guardError(ctx context.Context, q any, name string, token int64, err error) error {
	if err == nil {
		return nil
	}
	var stale *StaleTokenError
	if errors.As(MapError(err), &stale) {
		if stale.Name == "" {
			stale.Name, stale.Presented = name, token
		}
		return stale
	}
	if pgerr.Code(err) == pgerr.ReadOnlyTransaction {
		return fmt.Errorf("fencedwrite: fencing guard for lease %q locks the lease row, so it needs a read-write transaction on the primary: %w",
			name, standbyError(ctx, q, err))
	}
	return fmt.Errorf("fencedwrite: fencing guard for lease %q: %w", name, notMigrated(err))
}

// isNil reports whether v is nil or a nil pointer in an interface, which
// would otherwise panic on the first method call.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}
