// Package databasesql lets database/sql users (pgx's stdlib driver,
// lib/pq, and what is built on them: GORM, sqlx, bun, ent) use pgbaton's
// transaction-scoped parts in the *sql.Tx they already have:
//
//	err := db.Transaction(func(tx *gorm.DB) error { // GORM
//		sqlTx := databasesql.Wrap(tx.Statement.ConnPool.(*sql.Tx))
//		if err := fencedwrite.GuardLease(ctx, sqlTx, lease); err != nil {
//			return err
//		}
//		return tx.Create(&order).Error
//	})
//
// Wrap gives a *sql.Tx (a *sqlx.Tx embeds one: Wrap(tx.Tx)) as a
// pgbaton.Tx, which advisory's XactLock family, leasetable's CompleteTx
// and fencedwrite's Guard, GuardLease, SetToken, BypassFencing and
// MarkProcessed take; WrapQuerier gives a *sql.DB, *sql.Conn or *sql.Tx as
// a pgbaton.Querier for fencedwrite's value helpers, EnableFencing and
// PruneProcessed. fencedwrite.InSQLTx is InTx on a *sql.DB.
//
// # Design
//
// pgbaton speaks pgx natively. Its functions take two small pgx-shaped
// interfaces (pgbaton.Querier and pgbaton.Tx: Exec, Query, QueryRow, and
// for Tx Commit and Rollback) that pgx.Tx and *pgxpool.Pool satisfy as
// they are, and this package is the one adapter from database/sql to them.
// Every statement is the same generated query a pgx user runs, with the
// same SQL text; nothing is written twice. (River took the other road: a
// driver interface generic over the transaction type, and its queries
// generated a second time for database/sql.) The package imports only the
// standard library and pgx's own types, so a pgx user's build gains no
// database/sql driver, and a database/sql user brings their own.
//
// The adapter turns what database/sql hands back into what pgx would:
// sql.ErrNoRows into pgx.ErrNoRows, a server error of a driver other than
// pgx's stdlib (lib/pq's *pq.Error, recognised by its SQLState method)
// into a *pgconn.PgError that still wraps the driver's error, so that
// pgbaton's errors (fencedwrite.ErrStaleToken, ErrAlreadyProcessed,
// advisory.ErrLocked, pgbaton.ErrNotMigrated, ...) are the same whichever
// driver runs the statement; errors.As finds the driver's own error too.
// Arrays are passed as Go slices, which pgx's stdlib and current lib/pq
// (tested: v1.12.3) accept. Tested with pgx's stdlib (also under GORM and
// sqlx) and with lib/pq under sqlx (examples/databasesql).
//
// What database/sql cannot give: the server's in_hot_standby report,
// which pgx reads from the connection. A value write or MarkProcessed
// refused on a standby inside a wrapped transaction therefore returns
// PostgreSQL's read-only error (SQLSTATE 25006) without
// pgbaton.ErrStandby; the guards ask the server in their own statement
// and report ErrStandby as with pgx.
//
// [Fenced writes] shows fencedwrite.InSQLTx and Wrap in use, in its
// section "database/sql".
//
// [Fenced writes]: https://github.com/pgbaton/pgbaton/blob/main/docs/fenced-writes.md
package databasesql

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton"
)

// Queryer is what *sql.DB, *sql.Conn and *sql.Tx have in common.
type Queryer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Wrap returns tx as a pgbaton.Tx, or nil for a nil tx (which every
// pgbaton function then refuses with pgbaton.ErrInvalidArgument). The
// result runs its statements in tx; its Commit and Rollback commit and
// roll back tx.
func Wrap(tx *sql.Tx) pgbaton.Tx {
	if tx == nil {
		return nil
	}
	return sqlTx{querier{tx}, tx}
}

// WrapQuerier returns q (a *sql.DB, *sql.Conn or *sql.Tx) as a
// pgbaton.Querier, or nil for a nil q.
func WrapQuerier(q Queryer) pgbaton.Querier {
	if q == nil || reflect.ValueOf(q).Kind() == reflect.Pointer && reflect.ValueOf(q).IsNil() {
		return nil
	}
	return querier{q}
}

type querier struct{ q Queryer }

func (w querier) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	res, err := w.q.ExecContext(ctx, query, args...)
	if err != nil {
		return pgconn.CommandTag{}, convert(err)
	}
	// database/sql keeps no command tag; its number of rows is what
	// pgbaton reads of one.
	n, err := res.RowsAffected()
	if err != nil {
		return pgconn.CommandTag{}, nil
	}
	return pgconn.NewCommandTag("ROWS " + strconv.FormatInt(n, 10)), nil
}

func (w querier) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	r, err := w.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, convert(err)
	}
	return &rows{r: r}, nil
}

func (w querier) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return row{w.q.QueryRowContext(ctx, query, args...)}
}

type sqlTx struct {
	querier
	tx *sql.Tx
}

// Commit and Rollback take no context: database/sql ties a transaction to
// the context it was begun with.
func (t sqlTx) Commit(context.Context) error   { return convert(t.tx.Commit()) }
func (t sqlTx) Rollback(context.Context) error { return convert(t.tx.Rollback()) }

type row struct{ r *sql.Row }

func (r row) Scan(dest ...any) error {
	err := r.r.Scan(scanTargets(dest)...)
	if errors.Is(err, sql.ErrNoRows) {
		return pgx.ErrNoRows
	}
	return convert(err)
}

// rows is pgx.Rows over *sql.Rows, as far as generated queries use it:
// Next, Scan, Values, Err, Close.
type rows struct {
	r   *sql.Rows
	err error
	m   *pgtype.Map
}

func (r *rows) TypeMap() *pgtype.Map {
	if r.m == nil {
		r.m = pgtype.NewMap()
	}
	return r.m
}

func (r *rows) Close()                                       { _ = r.r.Close() }
func (r *rows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r *rows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r *rows) RawValues() [][]byte                          { return nil }
func (r *rows) Conn() *pgx.Conn                              { return nil }
func (r *rows) Next() bool                                   { return r.err == nil && r.r.Next() }

func (r *rows) Err() error {
	if r.err != nil {
		return r.err
	}
	return convert(r.r.Err())
}

func (r *rows) Scan(dest ...any) error {
	if err := r.r.Scan(scanTargets(dest)...); err != nil {
		r.err = convert(err)
		_ = r.r.Close()
		return r.err
	}
	return nil
}

func (r *rows) Values() ([]any, error) {
	cols, err := r.r.Columns()
	if err != nil {
		return nil, convert(err)
	}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := r.Scan(ptrs...); err != nil {
		return nil, err
	}
	return vals, nil
}

// scanTargets passes on what database/sql scans into by itself, and wraps
// the rest (arrays, pgtype values without a Scanner) in a scanner that
// decodes PostgreSQL's text form the way pgx does.
func scanTargets(dest []any) []any {
	var m *pgtype.Map
	out := dest
	for i, d := range dest {
		if scansItself(d) {
			continue
		}
		if m == nil {
			m = pgtype.NewMap()
			out = append([]any(nil), dest...)
		}
		out[i] = m.SQLScanner(d)
	}
	return out
}

func scansItself(d any) bool {
	switch d.(type) {
	case sql.Scanner, *any, *[]byte, *sql.RawBytes, *time.Time, *string:
		return true
	}
	v := reflect.ValueOf(d)
	if v.Kind() != reflect.Pointer {
		return false
	}
	switch v.Type().Elem().Kind() {
	case reflect.Bool, reflect.String, reflect.Float32, reflect.Float64,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// driverError is a server error of a driver other than pgx's, seen as
// the *pgconn.PgError pgbaton maps; errors.As still finds the driver's.
type driverError struct {
	pg     *pgconn.PgError
	driver error
}

func (e *driverError) Error() string   { return e.driver.Error() }
func (e *driverError) Unwrap() []error { return []error{e.pg, e.driver} }

// convert returns err with a *pgconn.PgError in its chain when it is a
// server error: as it is from pgx's stdlib, made from the fields of
// another driver's error (lib/pq's *pq.Error has SQLState, Severity,
// Message, Detail, Hint, Where, Schema, Table, Column, Constraint).
func convert(err error) error {
	var pgErr *pgconn.PgError
	if err == nil || errors.As(err, &pgErr) {
		return err
	}
	var coded interface{ SQLState() string }
	if !errors.As(err, &coded) {
		return err
	}
	pgErr = &pgconn.PgError{Code: coded.SQLState()}
	if v := reflect.ValueOf(coded); v.Kind() == reflect.Pointer && !v.IsNil() && v.Elem().Kind() == reflect.Struct {
		s := v.Elem()
		for name, to := range map[string]*string{
			"Severity": &pgErr.Severity, "Message": &pgErr.Message, "Detail": &pgErr.Detail, "Hint": &pgErr.Hint,
			"Where": &pgErr.Where, "SchemaName": &pgErr.SchemaName, "Schema": &pgErr.SchemaName,
			"TableName": &pgErr.TableName, "Table": &pgErr.TableName, "ColumnName": &pgErr.ColumnName,
			"Column": &pgErr.ColumnName, "ConstraintName": &pgErr.ConstraintName, "Constraint": &pgErr.ConstraintName,
		} {
			if f := s.FieldByName(name); f.IsValid() && f.Kind() == reflect.String {
				*to = f.String()
			}
		}
	}
	return &driverError{pg: pgErr, driver: err}
}
