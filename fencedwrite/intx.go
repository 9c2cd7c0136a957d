package fencedwrite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/databasesql"
	"github.com/pgbaton/pgbaton/internal/db"
)

// Querier runs statements: a *pgxpool.Pool, *pgx.Conn or pgx.Tx, or a
// *sql.DB, *sql.Conn or *sql.Tx wrapped by databasesql.WrapQuerier.
type Querier = pgbaton.Querier

// Beginner starts transactions and runs statements: a *pgxpool.Pool (best:
// after a connection failure InTx asks a fresh connection how the commit
// went) or a *pgx.Conn.
type Beginner interface {
	Querier
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// rollbackTimeout bounds the rollback after a failure, which runs even when
// ctx is already cancelled so the connection goes back to the pool clean.
const rollbackTimeout = 10 * time.Second

// InTx runs fn in a READ COMMITTED transaction guarded by lease (see Guard)
// and commits it. It returns nil only if the transaction committed.
//
//   - A stale token, found by the guard, by a statement in fn (a fenced
//     table's trigger, pgbaton.assert_token) or at COMMIT, is a
//     *StaleTokenError: nothing was written.
//   - An error from fn rolls back and is returned as it is (PB001 errors
//     mapped as above).
//   - A COMMIT that fails is never reported as a bare driver error. If the
//     reply was lost, InTx asks the database (txid_status, on another
//     connection of pool, on the timeline the transaction ran on: a
//     failover since makes the answer ErrCommitUnknown, because a promoted
//     standby that lost the commit may know its id as another
//     transaction) whether the transaction committed: if it did,
//     InTx returns nil. If it did not and the lease has moved meanwhile,
//     the error is a *StaleTokenError wrapping the commit error; if it did
//     not and the lease is still held, the commit error says nothing was
//     written. If the database cannot tell, the error wraps
//     ErrCommitUnknown.
//
// fn must not commit or roll back tx, and should return the error of any
// statement that fails: after a failed statement PostgreSQL refuses the
// rest of the transaction anyway.
func InTx(ctx context.Context, pool Beginner, lease Lease, fn func(pgx.Tx) error) error {
	name, token, err := checkInTx(isNil(pool), lease, fn == nil)
	if err != nil {
		return err
	}
	return traced(ctx, name, token, func(ctx context.Context) error {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
		if err != nil {
			return fmt.Errorf("fencedwrite: begin transaction for lease %q: %w", name, err)
		}
		return guardedTx(ctx, pool, name, token, tx, func() error { return fn(tx) })
	})
}

// InSQLTx is InTx for database/sql: it runs fn in a READ COMMITTED
// transaction of db guarded by lease and commits it, with InTx's
// outcomes. A COMMIT whose reply is lost is settled the same way, by
// asking txid_status on another connection of db on the transaction's
// timeline: nil only if the transaction committed, ErrCommitUnknown when
// the database cannot tell. Cancelling ctx while fn runs makes
// database/sql roll the transaction back.
//
// fn must not commit or roll back tx. GORM writes on tx through a session
// bound to it (g := gdb.Session(&gorm.Session{Context: ctx}); then
// g.Statement.ConnPool = tx); or use GORM's own db.Transaction with
// GuardLease on databasesql.Wrap of its *sql.Tx.
func InSQLTx(ctx context.Context, db *sql.DB, lease Lease, fn func(*sql.Tx) error) error {
	name, token, err := checkInTx(db == nil, lease, fn == nil)
	if err != nil {
		return err
	}
	return traced(ctx, name, token, func(ctx context.Context) error {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return fmt.Errorf("fencedwrite: begin transaction for lease %q: %w", name, err)
		}
		return guardedTx(ctx, databasesql.WrapQuerier(db), name, token, databasesql.Wrap(tx), func() error { return fn(tx) })
	})
}

func checkInTx(nilPool bool, lease Lease, nilFn bool) (name string, token int64, err error) {
	switch {
	case nilPool:
		return "", 0, fmt.Errorf("%w: nil pool", pgbaton.ErrInvalidArgument)
	case isNil(lease):
		return "", 0, fmt.Errorf("%w: nil lease", pgbaton.ErrInvalidArgument)
	case nilFn:
		return "", 0, fmt.Errorf("%w: nil function", pgbaton.ErrInvalidArgument)
	}
	name, token = lease.Name(), lease.Token()
	return name, token, checkToken(name, token)
}

// guardedTx guards tx, which InTx or InSQLTx began, runs fn and commits;
// pool (on which tx does not run) settles a COMMIT that failed.
func guardedTx(ctx context.Context, pool Querier, name string, token int64, tx pgbaton.Tx, fn func() error) error {
	// Also on a panic in fn; after Commit it is a no-op (pgx.ErrTxClosed,
	// sql.ErrTxDone).
	defer rollback(ctx, tx)
	row, err := db.New().FenceAssertTokenXid(ctx, tx, db.FenceAssertTokenXidParams{Name: name, Token: token})
	switch {
	case err != nil:
		return guardError(ctx, tx, name, token, err)
	case row.Standby:
		return standbyGuard(name)
	}
	if err := fn(); err != nil {
		return MapError(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return commitError(ctx, pool, name, token, txRef{xid: row.Xid, timeline: row.Timeline}, err)
	}
	return nil
}

func rollback(ctx context.Context, tx pgbaton.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(ctx) // on failure pgx closes the connection, which rolls back too
}

// txRef names a transaction: its id, and the timeline it ran on (0 when the
// server does not tell). After a promotion that lost WAL, the new timeline
// hands the lost transactions' ids to transactions of its own, so an id is
// asked about only on its own timeline.
type txRef struct {
	xid, timeline int64
}

// commitError explains a failed COMMIT of the transaction tx.
func commitError(ctx context.Context, pool Querier, name string, token int64, tx txRef, err error) error {
	// Find out even if ctx is what ended the commit: an honest answer is
	// worth a short wait.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if mapped := MapError(err); errors.Is(mapped, ErrStaleToken) {
		return mapped // a deferred fence check failed at commit
	}
	if !notCommitted(err) {
		committed, statusErr := commitStatus(ctx, pool, tx)
		switch {
		case statusErr != nil:
			return fmt.Errorf("%w: lease %q: COMMIT failed (%w) and its outcome could not be read: %w",
				ErrCommitUnknown, name, err, statusErr)
		case committed:
			return nil // the reply was lost, the commit was not
		}
	}
	// Nothing was written. Say whether the lease moved, which is what the
	// caller must act on.
	_, check := db.New().FenceAssertToken(ctx, pool, db.FenceAssertTokenParams{Name: name, Token: token})
	var stale *StaleTokenError
	if errors.As(guardError(ctx, pool, name, token, check), &stale) {
		stale.Err = err
		return stale
	}
	return fmt.Errorf("fencedwrite: commit under lease %q failed, nothing was written: %w", name, err)
}

// notCommitted reports whether a COMMIT error proves the transaction did
// not commit: the server answered with ROLLBACK or an ERROR. Anything else
// (a network error, a FATAL, even pgconn's "safe to retry" errors, which
// pgx also returns when the connection broke after COMMIT was sent) is
// settled by asking the database.
func notCommitted(err error) bool {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return true
	case errors.As(err, &pgErr):
		return pgErr.Severity == "ERROR"
	}
	return false
}

// commitStatus asks the database whether transaction tx committed,
// waiting while it is still in progress (a backend that is being
// terminated finishes its abort first). It answers only from the timeline
// tx ran on: a server on another one (promoted since, or a standby) may
// know the same id as another transaction.
func commitStatus(ctx context.Context, pool Querier, tx txRef) (committed bool, err error) {
	q := db.New()
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		row, err := q.FenceTxStatus(ctx, pool, tx.xid)
		switch {
		case err != nil:
			return false, err
		case row.Timeline != tx.timeline:
			return false, fmt.Errorf("fencedwrite: the transaction ran on timeline %d, the server now answering is on %d (a failover happened; 0: not told)",
				tx.timeline, row.Timeline)
		case row.Status == "committed":
			return true, nil
		case row.Status == "aborted":
			return false, nil
		case row.Status != "in progress":
			return false, fmt.Errorf("fencedwrite: txid_status(%d) is %q", tx.xid, row.Status)
		}
		select {
		case <-ctx.Done():
			return false, context.Cause(ctx)
		case <-time.After(wait):
		}
	}
}
