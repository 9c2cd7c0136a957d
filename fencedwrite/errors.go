package fencedwrite

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// SQLStateStaleToken is the SQLSTATE with which the database rejects a stale token:
// pgbaton.assert_token, the pgbaton.reject_stale_token trigger and nothing
// else. Class PB ("pgbaton") is not used by PostgreSQL. Clients in other
// languages test for this code.
const SQLStateStaleToken = pgerr.StaleToken // "PB001"

// ErrStaleToken means a write carried a fencing token that is no longer
// valid: the lease was taken over, released or expired, or a fenced row was
// written with a newer token. Nothing was written. Stop working under this
// token; retrying with it cannot succeed. The error is a *StaleTokenError
// with the details; test for it with errors.Is.
var ErrStaleToken = errors.New("fencedwrite: stale fencing token")

// ErrCommitUnknown means the connection failed while COMMIT was in flight
// and the database could not be asked afterwards whether the transaction
// committed. The write may or may not have happened; check the data before
// doing it again.
var ErrCommitUnknown = errors.New("fencedwrite: commit outcome unknown")

// ErrNotFound is returned by GetValue for a key that has no value.
var ErrNotFound = errors.New("fencedwrite: fenced value not found")

// ErrAlreadyProcessed is returned by MarkProcessed when the consumer has
// already processed the message: skip it (acknowledge it without doing
// its work again). The transaction is aborted; roll it back.
var ErrAlreadyProcessed = errors.New("fencedwrite: message already processed")

// SQLStateAlreadyProcessed is the SQLSTATE with which
// pgbaton.mark_processed reports a repeat, for clients in other languages.
const SQLStateAlreadyProcessed = pgerr.AlreadyProcessed // "PB409"

// ErrValueChanged is returned by CompareAndSwapValue when the stored value
// is not the expected one (or exists when absence was expected).
var ErrValueChanged = errors.New("fencedwrite: fenced value changed")

// Reason says why a token was rejected. The values are the words the
// database writes into the error's DETAIL (reason=...), stable for
// programs to compare; clients in other languages see the same.
type Reason string

// Why a write's token was rejected.
const (
	// ReasonSuperseded: the lease was granted again, with a newer token.
	ReasonSuperseded Reason = "superseded"
	// ReasonExpired: the token is the lease's latest, but the lease
	// expired by the database clock.
	ReasonExpired Reason = "expired"
	// ReasonReleased: the token is the lease's latest, but the lease was
	// released (or force-released).
	ReasonReleased Reason = "released"
	// ReasonNoLease: the lease has no row: it was completed (leasetable
	// deletes the row of a finished work item), or never granted. Current
	// is 0 then.
	ReasonNoLease Reason = "no such lease"
	// ReasonNotGranted: the token is newer than any this lease was
	// granted: from another lease, or made up.
	ReasonNotGranted Reason = "not granted"
	// ReasonNotHeld: pgbaton.complete_tx (leasetable's CompleteTx) found
	// the lease no longer held with this token.
	ReasonNotHeld Reason = "not held"
	// ReasonOlderThanRow: a fenced row was last written with a newer token.
	ReasonOlderThanRow Reason = "older than the row's"
	// ReasonNoToken: a write to a fenced row presented no token (Presented
	// is 0), or wrote NULL over the row's.
	ReasonNoToken Reason = "no token"
	// ReasonOlderThanValue: a fenced value was last written with a newer
	// token.
	ReasonOlderThanValue Reason = "older than the value's"
)

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
	// Reason says why; compare it with the Reason constants.
	Reason Reason
	// Err is the underlying error (usually the *pgconn.PgError), if any.
	Err error
}

func (e *StaleTokenError) Error() string {
	switch {
	case e.Reason == ReasonNoLease:
		return fmt.Sprintf("fencedwrite: stale fencing token for %q: presented %d, no such lease (completed, or never granted)", e.Name, e.Presented)
	case e.Presented == 0 && e.Reason != "":
		return fmt.Sprintf("fencedwrite: stale fencing token for %q: none presented, current %d (%s)", e.Name, e.Current, e.Reason)
	case e.Reason == "":
		return fmt.Sprintf("fencedwrite: stale fencing token for %q: presented %d, current %d", e.Name, e.Presented, e.Current)
	}
	return fmt.Sprintf("fencedwrite: stale fencing token for %q: presented %d, current %d (%s)", e.Name, e.Presented, e.Current, e.Reason)
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
	if err == nil || errors.Is(err, ErrStaleToken) || !errors.As(err, &pgErr) || pgErr.Code != SQLStateStaleToken {
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
	e.Reason, e.Name = Reason(reason), name
	return e
}

// notMigrated wraps err from one of pgbaton's own statements with
// pgbaton.ErrNotMigrated when it says pgbaton's objects are missing
// (undefined function or table, or no pgbaton schema), and returns other
// errors unchanged.
func notMigrated(err error) error {
	if pgerr.Shared(err) == pgbaton.ErrNotMigrated {
		return fmt.Errorf("%w; %s: %w", pgbaton.ErrNotMigrated, pgerr.MigrateHint, err)
	}
	return err
}
