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

	// ErrClosed is returned by a locker or client after Close.
	ErrClosed = errors.New("pgbaton: closed")
)
