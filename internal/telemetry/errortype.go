package telemetry

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbaton/pgbaton"
)

// ErrorTypeKey is the attribute of the OpenTelemetry semantic conventions
// that classifies a failure (error.type).
const ErrorTypeKey = "error.type"

// Values of error.type besides a SQLSTATE. Short, stable and few, as the
// conventions ask: one series per class, never per message.
const (
	ErrorTimeout      = "timeout"            // the context's deadline passed
	ErrorCanceled     = "canceled"           // the context was cancelled
	ErrorStandby      = "standby"            // pgbaton.ErrStandby: connected to a standby
	ErrorNotMigrated  = "not_migrated"       // pgbaton.ErrNotMigrated
	ErrorSchemaTooNew = "schema_too_new"     // pgbaton.ErrSchemaTooNew
	ErrorUnsupported  = "unsupported_server" // pgbaton.ErrUnsupportedServer: not PostgreSQL
	ErrorConnection   = "connection"         // the connection failed or was closed
	ErrorOther        = "_OTHER"             // the conventions' fallback
)

// ErrorType classifies err for error.type. A database error is its
// SQLSTATE (e.g. "53200" when the lock table is full, "57P01" when the
// backend was terminated), as the database conventions have it
// (db.response.status_code); pgbaton's and the context's sentinels have the
// short names above; a failed or lost connection is "connection"; anything
// else "_OTHER". nil is "".
func ErrorType(err error) string {
	var pgErr *pgconn.PgError
	var netErr net.Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &pgErr):
		return pgErr.Code
	case errors.Is(err, context.DeadlineExceeded):
		return ErrorTimeout
	case errors.Is(err, context.Canceled):
		return ErrorCanceled
	case errors.Is(err, pgbaton.ErrStandby):
		return ErrorStandby
	case errors.Is(err, pgbaton.ErrNotMigrated):
		return ErrorNotMigrated
	case errors.Is(err, pgbaton.ErrSchemaTooNew):
		return ErrorSchemaTooNew
	case errors.Is(err, pgbaton.ErrUnsupportedServer):
		return ErrorUnsupported
	case errors.As(err, &netErr), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed), pgconn.SafeToRetry(err), isConnectError(err):
		return ErrorConnection
	}
	return ErrorOther
}

func isConnectError(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce)
}
