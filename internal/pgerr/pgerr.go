// Package pgerr is where pgbaton reads SQLSTATEs: each code it acts on is
// named here once, and the codes that mean one of the shared sentinels of
// package pgbaton (ErrNotMigrated, ErrStandby, ErrInvalidArgument) are
// mapped to them here and nowhere else. A layer maps the codes that mean
// one of its own errors (advisory's full lock table, fencedwrite's stale
// token) itself, with these constants. Classify tells what a failed
// statement's error means for sending it again, and Retry sends it again
// once when that may cure it.
package pgerr

import (
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbaton/pgbaton"
)

// pgbaton's own SQLSTATEs, raised by its SQL functions. Class PB
// ("pgbaton") is not used by PostgreSQL.
const (
	// StaleToken rejects a write that carries a stale fencing token
	// (fencedwrite.SQLStateStaleToken).
	StaleToken = "PB001"
	// AlreadyProcessed reports a message processed before
	// (fencedwrite.SQLStateAlreadyProcessed).
	AlreadyProcessed = "PB409"
	// NotFound: an operator's call named a lease that is not there or not
	// held (pgbaton.force_release_lease).
	NotFound = "PB404"
)

// PostgreSQL's SQLSTATEs that pgbaton acts on.
const (
	// The pgbaton schema, or one of its functions or tables, is missing
	// (or, for fencedwrite, a table or column of the caller's).
	InvalidSchemaName = pgerrcode.InvalidSchemaName // 3F000
	UndefinedFunction = pgerrcode.UndefinedFunction // 42883
	UndefinedTable    = pgerrcode.UndefinedTable    // 42P01
	UndefinedColumn   = pgerrcode.UndefinedColumn   // 42703
	DatatypeMismatch  = pgerrcode.DatatypeMismatch  // 42804
	WrongObjectType   = pgerrcode.WrongObjectType   // 42809

	// A value pgbaton's SQL functions or tables refuse.
	InvalidParameterValue = pgerrcode.InvalidParameterValue // 22023
	CheckViolation        = pgerrcode.CheckViolation        // 23514

	// A write refused in a read-only transaction: on a standby, or in a
	// transaction the caller began read-only.
	ReadOnlyTransaction = pgerrcode.ReadOnlySQLTransaction // 25006

	// Out of shared memory: the server's lock table is full.
	OutOfSharedMemory = pgerrcode.OutOfMemory // 53200
	// A prepared statement is gone: the statement ran on another backend
	// than the one it was prepared on (a transaction-pooling proxy).
	InvalidStatementName = pgerrcode.InvalidSQLStatementName // 26000
	// lock_timeout expired.
	LockNotAvailable = pgerrcode.LockNotAvailable // 55P03
	// The statement was cancelled (a cancel request).
	QueryCanceled = pgerrcode.QueryCanceled // 57014
	// The server is shutting down, crashed, or is not accepting
	// connections yet: a switchover or restart.
	AdminShutdown    = pgerrcode.AdminShutdown    // 57P01
	CrashShutdown    = pgerrcode.CrashShutdown    // 57P02
	CannotConnectNow = pgerrcode.CannotConnectNow // 57P03
)

// MigrateHint is what an ErrNotMigrated error tells the operator to do.
const MigrateHint = "run `pgbaton migrate up` or migrations.Up"

// Code returns the SQLSTATE of the first *pgconn.PgError in err's chain,
// or "" when there is none.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Shared returns the shared sentinel that err's SQLSTATE stands for, or
// nil when it stands for none:
//
//   - pgbaton.ErrNotMigrated: the pgbaton schema, a function or a table is
//     missing (3F000, 42883, 42P01);
//   - pgbaton.ErrStandby: a write was refused as read-only (25006);
//   - pgbaton.ErrInvalidArgument: pgbaton's SQL refused a value (22023,
//     23514).
func Shared(err error) error {
	switch Code(err) {
	case InvalidSchemaName, UndefinedFunction, UndefinedTable:
		return pgbaton.ErrNotMigrated
	case ReadOnlyTransaction:
		return pgbaton.ErrStandby
	case InvalidParameterValue, CheckViolation:
		return pgbaton.ErrInvalidArgument
	}
	return nil
}

// Map wraps err with the shared sentinel its SQLSTATE stands for (see
// Shared), saying what failed: "<sentinel>: <what>: <err>", and for
// ErrNotMigrated what to do about it. ok is false, and mapped nil, when
// the SQLSTATE stands for no shared sentinel.
func Map(what string, err error) (mapped error, ok bool) {
	sentinel := Shared(err)
	switch sentinel {
	case nil:
		return nil, false
	case pgbaton.ErrNotMigrated:
		return fmt.Errorf("%w: %s: %w; %s", sentinel, what, err, MigrateHint), true
	}
	return fmt.Errorf("%w: %s: %w", sentinel, what, err), true
}

// Unfixable reports whether err is one that retrying cannot fix, so a
// loop that retries (a campaign, Keep) returns it: bad input, a closed
// client, or a database that refuses the layer (a standby, a schema not
// migrated or too new, an unsupported server). A layer with errors of its
// own tests them beside it.
func Unfixable(err error) bool {
	for _, e := range unfixable {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

var unfixable = []error{pgbaton.ErrInvalidArgument, pgbaton.ErrClosed, pgbaton.ErrStandby, pgbaton.ErrNotMigrated,
	pgbaton.ErrSchemaTooNew, pgbaton.ErrUnsupportedServer}
