package pgerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"

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
	} {
		f, flip := Classify(c.ctx, c.err)
		if f != c.want || flip != c.roleFlip {
			t.Errorf("%s: Classify = %d, %t; want %d, %t", c.name, f, flip, c.want, c.roleFlip)
		}
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
