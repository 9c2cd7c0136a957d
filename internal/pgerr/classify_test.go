package pgerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestClassify(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name     string
		ctx      context.Context
		err      error
		want     Failure
		roleFlip bool
	}{
		{"nil", context.Background(), nil, Permanent, false},
		{"standby", context.Background(), fmt.Errorf("renew: %w", &pgconn.PgError{Code: ReadOnlyTransaction}), NotApplied, true},
		{"shutdown", context.Background(), &pgconn.PgError{Code: AdminShutdown}, Ambiguous, true},
		{"other SQLSTATE", context.Background(), &pgconn.PgError{Code: CheckViolation}, Permanent, false},
		{"EOF", context.Background(), fmt.Errorf("read: %w", io.EOF), Ambiguous, false},
		{"connect", context.Background(), &pgconn.ConnectError{}, NotApplied, false},
		{"ended ctx", ended, io.EOF, Permanent, false},
		{"caller's deadline", context.Background(), fmt.Errorf("timeout: %w", context.DeadlineExceeded), Permanent, false},
		{"statement's own bound", context.Background(), Bounded(pastDeadline(t), time.Second, fmt.Errorf("timeout: %w", context.DeadlineExceeded)), Ambiguous, false},
		{"own bound, caller gone", ended, Bounded(pastDeadline(t), time.Second, context.DeadlineExceeded), Permanent, false},
	} {
		f, flip := Classify(c.ctx, c.err)
		if f != c.want || flip != c.roleFlip {
			t.Errorf("%s: Classify = %d, %t; want %d, %t", c.name, f, flip, c.want, c.roleFlip)
		}
	}
}

// pastDeadline is a context that ended at its deadline.
func pastDeadline(t *testing.T) context.Context {
	ctx, cancel := context.WithDeadline(context.Background(), time.Now())
	t.Cleanup(cancel)
	return ctx
}

// Bounded marks only a deadline error of a context that ended at its
// deadline: a server's answer (a PgError) or a live context's error stays
// what it was.
func TestBounded(t *testing.T) {
	pgErr := &pgconn.PgError{Code: CheckViolation}
	if err := Bounded(pastDeadline(t), time.Second, pgErr); err != error(pgErr) {
		t.Errorf("Bounded(PgError) = %v", err)
	}
	if err := Bounded(context.Background(), time.Second, context.DeadlineExceeded); errors.Is(err, ErrSlow) {
		t.Errorf("Bounded(live ctx) = %v", err)
	}
	err := Bounded(pastDeadline(t), 300*time.Millisecond, fmt.Errorf("timeout: %w", context.DeadlineExceeded))
	if !errors.Is(err, ErrSlow) || !errors.Is(err, context.DeadlineExceeded) || err.Error() != "no reply in time (bound 300ms): timeout: context deadline exceeded" {
		t.Errorf("Bounded = %v", err)
	}
	if Bounded(pastDeadline(t), time.Second, nil) != nil {
		t.Error("Bounded(nil) is not nil")
	}
}

type resetCounter int

func (r *resetCounter) Reset() { *r++ }

func TestRetry(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		name       string
		err        error
		repeatable bool
		calls      int
		resets     resetCounter
	}{
		{"success", nil, false, 1, 0},
		{"permanent", &pgconn.PgError{Code: CheckViolation}, true, 1, 0},
		{"not applied", &pgconn.ConnectError{}, false, 2, 0},
		{"ambiguous, not repeatable", io.EOF, false, 1, 0},
		{"ambiguous, repeatable", io.EOF, true, 2, 0},
		{"role flip", &pgconn.PgError{Code: ReadOnlyTransaction}, false, 2, 1},
	} {
		var pool resetCounter
		calls := 0
		err := Retry(context.Background(), &pool, log, c.repeatable, func(context.Context) error {
			calls++
			return c.err
		})
		if calls != c.calls || pool != c.resets || !errors.Is(err, c.err) {
			t.Errorf("%s: %d calls, %d resets, error %v; want %d, %d, %v", c.name, calls, pool, err, c.calls, c.resets, c.err)
		}
	}
}
