package pgbaton

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier runs statements, the way the functions that may run on a pool,
// a connection or a transaction (fencedwrite's value helpers, for one)
// need it: a *pgxpool.Pool, *pgx.Conn or pgx.Tx, or a database/sql
// *sql.DB, *sql.Conn or *sql.Tx wrapped by package databasesql.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Tx is the caller's transaction, as the transaction-scoped functions use
// it (advisory's XactLock family, leasetable's CompleteTx, fencedwrite's
// Guard, SetToken, BypassFencing and MarkProcessed): a pgx.Tx, or a
// database/sql *sql.Tx wrapped by databasesql.Wrap (GORM, sqlx, bun, ent
// and lib/pq users). It is a Querier that can commit: Commit and Rollback
// are in it so that a pool or a connection outside a transaction, on which
// a transaction-scoped lock or guard would end with its statement, is not
// accepted by mistake. pgbaton's functions never call them on the
// caller's transaction.
type Tx interface {
	Querier
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}
