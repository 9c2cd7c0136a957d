package pgbaton

import "errors"

// Errors shared by every layer. Each layer wraps them with details; test for
// them with errors.Is.
var (
	// ErrInvalidArgument is returned for bad input: empty or oversized
	// names, non-positive durations, nil pools, wrong tokens. Nothing was
	// changed.
	ErrInvalidArgument = errors.New("pgbaton: invalid argument")

	// ErrNotMigrated is returned when the pgbaton schema is missing or older
	// than this build needs. Run `pgbaton migrate up` or migrations.Up.
	ErrNotMigrated = errors.New("pgbaton: schema not migrated")

	// ErrSchemaTooNew is returned when the database was migrated by a newer
	// pgbaton than this build. Upgrade pgbaton.
	ErrSchemaTooNew = errors.New("pgbaton: database schema is newer than this pgbaton build")

	// ErrStandby is returned when the server is a standby (in recovery): locks
	// and leases need a writable primary.
	ErrStandby = errors.New("pgbaton: server is a standby (pg_is_in_recovery); connect to the primary")

	// ErrUnsupportedServer is returned when the server speaks the
	// PostgreSQL protocol but is not PostgreSQL and breaks what pgbaton
	// relies on: CockroachDB's pg_advisory_lock returns at once without
	// locking anything, and YugabyteDB caches sequence values per
	// connection, so tokens from a BIGSERIAL would not grow across
	// clients. The error says which server was found and why it is refused.
	ErrUnsupportedServer = errors.New("pgbaton: unsupported server (not PostgreSQL)")

	// ErrClosed is returned by a locker or client after Close.
	ErrClosed = errors.New("pgbaton: closed")

	// ErrDegraded is wrapped by a Check error that reports a working
	// client on a weaker path (for example waiters that poll because
	// notifications are not delivered through a transaction pooler):
	// nothing is wrong enough to take the service out of rotation, but an
	// operator should know. health.Handler stays ready and shows it.
	ErrDegraded = errors.New("pgbaton: degraded")
)
