package pgerr

import (
	"context"
	"fmt"
	"io"
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
