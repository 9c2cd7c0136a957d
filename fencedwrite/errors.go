package fencedwrite

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbaton/pgbaton"
)

// SQLState is the SQLSTATE with which the database rejects a stale token:
// pgbaton.assert_token, the pgbaton.reject_stale_token trigger and nothing
// else. Class PB ("pgbaton") is not used by PostgreSQL. Clients in other
// languages test for this code.
const SQLState = "PB001"

// ErrStaleToken means a write carried a fencing token that is no longer
// valid: the lease was taken over, released or expired, or a fenced row was
// written with a newer token. Nothing was written. Stop working under this
// token; retrying with it cannot succeed. The error is a *StaleTokenError
// with the details; test for it with errors.Is.
var ErrStaleToken = errors.New("pgbaton: stale fencing token")

// ErrCommitUnknown means the connection failed while COMMIT was in flight
// and the database could not be asked afterwards whether the transaction
// committed. The write may or may not have happened; check the data before
// doing it again.
var ErrCommitUnknown = errors.New("pgbaton: commit outcome unknown")

// ErrNotFound is returned by GetValue for a key that has no value.
var ErrNotFound = errors.New("pgbaton: fenced value not found")

// ErrValueChanged is returned by CompareAndSwapValue when the stored value
// is not the expected one (or exists when absence was expected).
var ErrValueChanged = errors.New("pgbaton: fenced value changed")

// StaleTokenError is the error behind ErrStaleToken.
type StaleTokenError struct {
	// Name is the lease name, or for a fenced row the table
	// ("schema.table"), or for a fenced value its key.
	Name string
	// Presented is the token the rejected write carried (0: none).
	Presented int64
	// Current is the lease's or row's token at the time (0: none, as for a
	// lease that does not exist).
	Current int64
	// Reason says why, in the database's words: "superseded", "expired",
	// "released", "unknown lease", "not granted", "older than the row's",
	// "no token".
	Reason string
	// Err is the underlying error (usually the *pgconn.PgError), if any.
	Err error
}

func (e *StaleTokenError) Error() string {
	msg := fmt.Sprintf("pgbaton: stale fencing token for %q: presented %d, current %d", e.Name, e.Presented, e.Current)
	if e.Reason != "" {
		msg += " (" + e.Reason + ")"
	}
	return msg
}

// Is makes errors.Is(err, ErrStaleToken) true.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// Unwrap returns the underlying error.
func (e *StaleTokenError) Unwrap() error { return e.Err }

// MapError turns a database error with SQLSTATE PB001 anywhere in err's
// chain into a *StaleTokenError (wrapping err) and returns every other
// error unchanged. Use it on errors from your own statements that call
// pgbaton.assert_token or write fenced tables.
func MapError(err error) error {
	var pgErr *pgconn.PgError
	if err == nil || errors.Is(err, ErrStaleToken) || !errors.As(err, &pgErr) || pgErr.Code != SQLState {
		return err
	}
	e := parseDetail(pgErr.Detail)
	e.Err = err
	return e
}

// parseDetail reads the DETAIL that pgbaton.raise_stale_token writes:
// "presented=N current=M reason=R name=NAME". The name comes last because it
// may contain anything; reasons never contain " name=".
func parseDetail(detail string) *StaleTokenError {
	e := &StaleTokenError{}
	rest, ok := strings.CutPrefix(detail, "presented=")
	if !ok {
		return e
	}
	presented, rest, _ := strings.Cut(rest, " current=")
	current, rest, _ := strings.Cut(rest, " reason=")
	reason, name, _ := strings.Cut(rest, " name=")
	e.Presented, _ = strconv.ParseInt(presented, 10, 64)
	e.Current, _ = strconv.ParseInt(current, 10, 64)
	e.Reason, e.Name = reason, name
	return e
}

// notMigrated wraps err from one of pgbaton's own statements with
// pgbaton.ErrNotMigrated when it says pgbaton's objects are missing
// (undefined function or table, or no pgbaton schema), and returns other
// errors unchanged.
func notMigrated(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42883", "42P01", "3F000":
			return fmt.Errorf("%w; run `pgbaton migrate up` or migrations.Up: %w", pgbaton.ErrNotMigrated, err)
		}
	}
	return err
}
