package fencedwrite

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// standbyProbeTimeout bounds the question "is this server a standby?"
// asked after a refused write, even when ctx has ended.
const standbyProbeTimeout = 5 * time.Second

// standbyError wraps err with pgbaton.ErrStandby when the server refused a
// write as read-only (SQLSTATE 25006) because it is a standby, and returns
// err unchanged otherwise. A read-only transaction on the primary refuses
// with the same code; it is not a standby. q ran the statement. (The
// guards ask pg_is_in_recovery() in their own statement instead.)
func standbyError(ctx context.Context, q any, err error) error {
	// Not pgerr.Map: on the primary, a transaction begun read-only
	// refuses with the same code.
	if pgerr.Code(err) != pgerr.ReadOnlyTransaction || errors.Is(err, pgbaton.ErrStandby) {
		return err
	}
	if !isStandby(ctx, q) {
		return err
	}
	return fmt.Errorf("%w: %w", pgbaton.ErrStandby, err)
}

// isStandby tells whether the server behind q is in recovery, without
// sending anything on a transaction (the refused write aborted it). On
// PostgreSQL 13, which does not report in_hot_standby, it cannot tell for
// a transaction and says no.
func isStandby(ctx context.Context, q any) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), standbyProbeTimeout)
	defer cancel()
	var conn *pgx.Conn
	switch c := q.(type) {
	case pgx.Tx:
		conn = c.Conn()
	case *pgx.Conn:
		conn = c
	case *pgxpool.Conn:
		conn = c.Conn()
	case *pgxpool.Pool:
		pc, err := c.Acquire(ctx)
		if err != nil {
			return false
		}
		defer pc.Release()
		conn = pc.Conn()
	}
	if conn == nil {
		return false
	}
	// PostgreSQL 14 and later report in_hot_standby with every connection:
	// no round trip, and it works in a transaction the error aborted.
	switch conn.PgConn().ParameterStatus("in_hot_standby") {
	case "on":
		return true
	case "off":
		return false
	}
	if _, inTx := q.(pgx.Tx); inTx {
		return false // aborted: nothing more can be asked on it
	}
	inRecovery, err := db.New().FenceInRecovery(ctx, conn)
	return err == nil && inRecovery
}
