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
