package pgerr

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbaton/pgbaton"
)

func TestMap(t *testing.T) {
	for code, want := range map[string]error{
		InvalidSchemaName:     pgbaton.ErrNotMigrated,
		UndefinedFunction:     pgbaton.ErrNotMigrated,
		UndefinedTable:        pgbaton.ErrNotMigrated,
		ReadOnlyTransaction:   pgbaton.ErrStandby,
		InvalidParameterValue: pgbaton.ErrInvalidArgument,
		CheckViolation:        pgbaton.ErrInvalidArgument,
	} {
		pgErr := &pgconn.PgError{Code: code}
		err := fmt.Errorf("query: %w", pgErr)
		if got := Code(err); got != code {
			t.Errorf("Code = %q, want %q", got, code)
		}
		mapped, ok := Map("renew", err)
		if !ok || !errors.Is(mapped, want) || !errors.Is(mapped, pgErr) {
			t.Errorf("%s: Map = %v, %v; want %v wrapping the server's error", code, mapped, ok, want)
		}
		if hint := strings.Contains(mapped.Error(), MigrateHint); hint != (want == pgbaton.ErrNotMigrated) {
			t.Errorf("%s: %q: the hint to migrate belongs to ErrNotMigrated alone", code, mapped)
		}
	}
	for _, err := range []error{nil, errors.New("not from the server"), &pgconn.PgError{Code: StaleToken}, &pgconn.PgError{Code: OutOfSharedMemory}} {
		if mapped, ok := Map("renew", err); ok || mapped != nil {
			t.Errorf("Map(%v) = %v, %v; want no shared sentinel", err, mapped, ok)
		}
	}
}

func TestUnfixable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("elect: %w", pgbaton.ErrSchemaTooNew), true},
		{fmt.Errorf("elect: %w", pgbaton.ErrStandby), true},
		{pgbaton.ErrClosed, true},
		{fmt.Errorf("elect: %w", &pgconn.PgError{Code: "40001"}), false},
		{errors.New("connection refused"), false},
	} {
		if got := Unfixable(c.err); got != c.want {
			t.Errorf("Unfixable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
