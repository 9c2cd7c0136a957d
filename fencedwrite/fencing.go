package fencedwrite

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// EnableFencing installs the fence on table, which must have a
// fence_token bigint column: the triggers pgbaton.reject_stale_token and
// pgbaton.fence_token_set. From then on, whichever client writes, every
// UPDATE or DELETE of a row whose fence_token is set must present a token
// not older than the row's, or it fails with a *StaleTokenError:
//
//   - an UPDATE presents the fence_token it assigns ("SET ...,
//     fence_token = $token"; assigning the row's own token again counts),
//     or the transaction's token;
//   - a DELETE presents the transaction's token: SetToken, SET LOCAL
//     pgbaton.fence_token, or pgbaton.present_token($token) in the
//     statement itself ("DELETE ... WHERE id = $1 AND
//     pgbaton.present_token($2)").
//
// A write that presents none fails with ReasonNoToken: a code path that
// forgot the token cannot slip past. An UPDATE leaves the newest token it
// presented in the row. Rows with a NULL fence_token are not fenced yet,
// and INSERT is never fenced. Running it again changes nothing. The SQL
// twin is pgbaton.enable_fencing(regclass).
//
// The fence is per row: it stops a stale holder from overwriting what a
// newer holder wrote. It cannot stop a stale holder that writes first, after
// a newer holder has read the row but before it writes; for
// read-modify-write under a lease use Guard or InTx. It cannot tell where a
// token came from either: it stops writers that are late or forgot the
// token, not ones that copy the row's ("SET fence_token = fence_token").
// TRUNCATE fires no row triggers and is not fenced. An UPDATE that moves a
// row to another partition is also a DELETE for the fence: present the
// transaction's token. In a MERGE, assign fence_token in every WHEN
// MATCHED THEN UPDATE action or in none: PostgreSQL counts it as assigned
// for all of them when one does, so the others would present the row's
// own token.
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
	if err := checkTable(table); err != nil {
		return err
	}
	return fencingError(ctx, q, op+" fencing on "+table.Sanitize(), run(ctx, q, table.Sanitize()))
}

func checkTable(table pgx.Identifier) error {
	if len(table) == 0 || len(table) > 3 {
		return fmt.Errorf("%w: table name needs 1 to 3 parts, got %d", pgbaton.ErrInvalidArgument, len(table))
	}
	for _, part := range table {
		if part == "" {
			return fmt.Errorf("%w: empty part in table name %s", pgbaton.ErrInvalidArgument, table.Sanitize())
		}
	}
	return nil
}

// fencingError explains the error of a statement that q ran on a table
// (what says which).
func fencingError(ctx context.Context, q any, what string, err error) error {
	if err == nil {
		return nil
	}
	err = standbyError(ctx, q, err)
	switch pgerr.Code(err) {
	case pgerr.UndefinedFunction, pgerr.InvalidSchemaName: // no pgbaton function
		return fmt.Errorf("fencedwrite: %s: %w", what, notMigrated(err))
	case pgerr.UndefinedTable, pgerr.UndefinedColumn, pgerr.DatatypeMismatch, pgerr.WrongObjectType, pgerr.InvalidParameterValue:
		// The caller's table or column: not pgbaton's schema.
		return fmt.Errorf("%w: %s: %w", pgbaton.ErrInvalidArgument, what, err)
	}
	return fmt.Errorf("fencedwrite: %s: %w", what, err)
}

// BypassFencing lets the rest of tx write table, a fenced table, without
// presenting a token; rows keep their tokens. It is the operator's way to
// correct data in a fenced table; a made-up token would be worse: a large
// one stays in the rows it writes and locks every holder out of them for
// good. It needs role pgbaton_admin (or a superuser) and a reason, and
// writes an audit row to pgbaton.event (action bypass_fencing, who, why,
// which table, the transaction) in tx: a bypass that rolls back leaves
// neither trace nor effect. Other tables stay fenced. The SQL twin is
// pgbaton.bypass_fencing(table, reason).
func BypassFencing(ctx context.Context, tx pgbaton.Tx, table pgx.Identifier, reason string) error {
	if isNil(tx) {
		return fmt.Errorf("%w: nil transaction; the bypass lasts for one transaction", pgbaton.ErrInvalidArgument)
	}
	if err := checkTable(table); err != nil {
		return err
	}
	if strings.TrimSpace(reason) == "" {
		return fmt.Errorf("%w: bypassing the fence needs a reason", pgbaton.ErrInvalidArgument)
	}
	_, err := db.New().FenceBypass(ctx, tx, db.FenceBypassParams{Relation: table.Sanitize(), Reason: reason})
	return fencingError(ctx, tx, "bypass fencing on "+table.Sanitize(), err)
}

// SetToken sets the token that writes in tx present to fenced tables (see
// EnableFencing), until tx ends: the setting pgbaton.fence_token, which
// pgbaton.reject_stale_token checks for DELETE and UPDATE. Statements on
// other connections are not affected. The SQL twin, usable inside any
// statement, is pgbaton.present_token(token).
func SetToken(ctx context.Context, tx pgbaton.Tx, token int64) error {
	if isNil(tx) {
		return fmt.Errorf("%w: nil transaction", pgbaton.ErrInvalidArgument)
	}
	if err := positive(token); err != nil {
		return err
	}
	if err := db.New().FenceSetToken(ctx, tx, token); err != nil {
		return fmt.Errorf("fencedwrite: set fence token: %w", err)
	}
	return nil
}
