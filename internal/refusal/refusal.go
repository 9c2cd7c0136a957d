// Package refusal tells server errors that need an operator, not a retry,
// for the packages above the layers (jobs, retention).
package refusal

import (
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbaton/pgbaton"
)

var sentinels = map[string]error{
	pgerrcode.InvalidSchemaName:      pgbaton.ErrNotMigrated,
	pgerrcode.UndefinedFunction:      pgbaton.ErrNotMigrated,
	pgerrcode.UndefinedTable:         pgbaton.ErrNotMigrated,
	pgerrcode.ReadOnlySQLTransaction: pgbaton.ErrStandby,
}

// Wrap returns err prefixed with prefix ("jobs: claim slot of x"), and,
// when the server refused because the schema is missing or it is a
// standby, wrapping pgbaton.ErrNotMigrated or pgbaton.ErrStandby too.
func Wrap(prefix string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && sentinels[pgErr.Code] != nil {
		return fmt.Errorf("%w: %s: %w", sentinels[pgErr.Code], prefix, err)
	}
	return fmt.Errorf("%s: %w", prefix, err)
}
