package fencedwrite

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// EnableFencing installs the trigger pgbaton.reject_stale_token on table,
// which must have a fence_token bigint column: from then on an UPDATE whose
// new fence_token is lower than the row's, or a DELETE whose transaction
// token (SetToken) is, fails with a *StaleTokenError, whichever client
// sends it. Running it again changes nothing. The SQL twin is
// pgbaton.enable_fencing(regclass).
//
// The fence is per row: it stops a stale holder from overwriting what a
// newer holder wrote. It cannot stop a stale holder that writes first, after
// a newer holder has read the row but before it writes; for
// read-modify-write under a lease use Guard or InTx.
func EnableFencing(ctx context.Context, q Querier, table pgx.Identifier) error {
	return fencing(ctx, q, table, "enable", db.New().FenceEnable)
}

// DisableFencing removes the trigger EnableFencing installed; a no-op
// when there is none.
func DisableFencing(ctx context.Context, q Querier, table pgx.Identifier) error {
	return fencing(ctx, q, table, "disable", db.New().FenceDisable)
}

func fencing(ctx context.Context, q Querier, table pgx.Identifier, op string, run func(context.Context, db.DBTX, string) error) error {
	if isNil(q) {
		return fmt.Errorf("%w: nil pool, connection or transaction", pgbaton.ErrInvalidArgument)
	}
	if len(table) == 0 || len(table) > 3 {
		return fmt.Errorf("%w: table name needs 1 to 3 parts, got %d", pgbaton.ErrInvalidArgument, len(table))
	}
	for _, part := range table {
		if part == "" {
			return fmt.Errorf("%w: empty part in table name %s", pgbaton.ErrInvalidArgument, table.Sanitize())
		}
	}
	err := run(ctx, q, table.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42883", "3F000": // no pgbaton.enable_fencing
			return fmt.Errorf("pgbaton: %s fencing on %s: %w", op, table.Sanitize(), notMigrated(err))
		case "42P01", "42703", "42804", "42809", "22023": // no such table or column, wrong type or kind
			return fmt.Errorf("%w: %s fencing on %s: %w", pgbaton.ErrInvalidArgument, op, table.Sanitize(), err)
		}
	}
	if err != nil {
		return fmt.Errorf("pgbaton: %s fencing on %s: %w", op, table.Sanitize(), err)
	}
	return nil
}

// SetToken sets the token that writes in tx present to fenced tables,
// until tx ends: the setting pgbaton.fence_token, which
// pgbaton.reject_stale_token checks for DELETE (which has no new row to
// carry a fence_token) and, when set, for UPDATE too. Statements on other
// connections are not affected.
func SetToken(ctx context.Context, tx pgx.Tx, token int64) error {
	if isNil(tx) {
		return fmt.Errorf("%w: nil transaction", pgbaton.ErrInvalidArgument)
	}
	if err := positive(token); err != nil {
		return err
	}
	if err := db.New().FenceSetToken(ctx, tx, token); err != nil {
		return fmt.Errorf("pgbaton: set fence token: %w", err)
	}
	return nil
}
