package advisory

import (
	"errors"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory/internal/pgsession"
)

// Errors of package advisory. Test for them with errors.Is; the errors
// returned carry details around them.
var (
	// ErrLocked is returned by TryLock, TryRLock, XactTryLock and a
	// skip-if-held RunExclusive when another session (or another goroutine
	// of this Locker) holds the lock.
	ErrLocked = errors.New("advisory: lock is held elsewhere")

	// ErrLockLost is the cause of a Lock's context and the error of Err once
	// the session holding it is gone (connection failed, ping timed out,
	// backend terminated, Locker closed). Postgres may already have granted
	// the lock to someone else.
	ErrLockLost = pgsession.ErrLockLost

	// ErrUnlocked is the cause of a Lock's context after Unlock.
	ErrUnlocked = errors.New("advisory: lock was unlocked")

	// ErrLockTableFull is returned when Postgres reports SQLSTATE 53200 (out
	// of shared memory: the server-wide lock table is full, after which even
	// new logins fail) or before that, when the Locker already holds
	// Config.MaxLocks locks. Release locks, or raise
	// max_locks_per_transaction on the server.
	ErrLockTableFull = pgsession.ErrLockTableFull

	// ErrSessionPooling is returned when a session connection turns out to
	// be served by a pooler such as PgBouncer in transaction or statement
	// mode (the backend changes between statements, or is shared with
	// another connection): session locks would be taken and released on
	// random backends. Connect the Locker to
	// Postgres directly (or to a session-mode pool), or use XactLock, or the
	// leasetable package.
	ErrSessionPooling = pgsession.ErrSessionPooling

	// ErrKeyCollision is returned when a lock name hashes to the same key as
	// a different name already recorded in pgbaton.advisory_name. Nothing
	// was locked: rename one of the two.
	ErrKeyCollision = errors.New("advisory: two lock names share one key")

	// ErrNotHeld means that a call found the lock no longer held by this
	// Lock, so it changed nothing: Unlock of a Lock unlocked already, or
	// of one its session's backend no longer held. It is the same
	// condition as leasetable.ErrNotHeld. A loss itself (the session gone)
	// is ErrLockLost.
	ErrNotHeld = errors.New("advisory: lock not held")
)

// mapError maps server errors to this package's sentinels, or the shared
// ones (internal/pgerr).
var mapError = pgsession.MapError

// logRefusal logs err if it is a refusal an operator must act on: the
// server or the setup is unsafe for session locks (Error), or the lock
// table is full (Warn). Other errors are the caller's to report.
func (l *Locker) logRefusal(op string, err error) {
	switch {
	case errors.Is(err, pgbaton.ErrStandby), errors.Is(err, ErrSessionPooling), errors.Is(err, pgbaton.ErrUnsupportedServer),
		errors.Is(err, pgbaton.ErrNotMigrated), errors.Is(err, ErrKeyCollision):
		l.cfg.Logger.Error("advisory: refused", "op", op, "error", err)
	case errors.Is(err, ErrLockTableFull):
		l.cfg.Logger.Warn("advisory: refused: lock table full", "op", op, "error", err)
	}
}
