package advisory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// wait blocks in pg_advisory_lock on a connection of its own. Once the
// lock is granted the connection becomes a session holding it (and later
// other locks too). A wait given up (ctx ended, Locker closed) is
// cancelled on the server; because Postgres may grant the lock just as the
// cancel arrives, the connection then releases every advisory lock it
// holds before it is closed, so nothing is left behind.
func (l *Locker) wait(ctx context.Context, id lockID, shared bool) (*session, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, pgbaton.ErrClosed
	}
	l.bg.Add(1)
	l.mu.Unlock()
	defer l.bg.Done()

	for attempt := 0; ; attempt++ {
		sp, spare := l.takeSpare()
		conn, pid := sp.conn, sp.pid
		if !spare {
			var err error
			if conn, pid, err = l.openConn(ctx); err != nil {
				return nil, err
			}
		}
		s, err := l.waitOn(ctx, conn, pid, id, shared)
		var pgErr *pgconn.PgError
		if err != nil && spare && attempt < maxSpares && ctx.Err() == nil && !errors.As(err, &pgErr) && conn.IsClosed() {
			continue // the spare went stale while idle: take another
		}
		return s, err
	}
}

// waitOn blocks in pg_advisory_lock on conn (see wait).
func (l *Locker) waitOn(ctx context.Context, conn *pgx.Conn, pid int32, id lockID, shared bool) (*session, error) {
	// The query runs under its own context: cancelling it through pgx would
	// close the connection, and the server would release a lock granted in
	// the meantime only when it notices, some time later. Instead, when the
	// caller gives up (or Close is called), a cancel request stops the wait
	// on the server and the connection is cleared.
	wctx, wcancel := context.WithCancelCause(ctx)
	defer wcancel(nil)
	stopClose := context.AfterFunc(l.ctx, func() { wcancel(pgbaton.ErrClosed) })
	defer stopClose()
	qctx, qcancel := context.WithCancel(context.Background())
	defer qcancel()
	cancelled := make(chan struct{})
	var kill *time.Timer // written before cancelled is closed
	stop := context.AfterFunc(wctx, func() {
		defer close(cancelled)
		cctx, cancel := context.WithTimeout(context.Background(), l.cfg.PingTimeout)
		defer cancel()
		_ = conn.PgConn().CancelRequest(cctx)
		// If the statement is still running when the cancel should have
		// landed, the server is unreachable: drop the connection.
		kill = time.AfterFunc(l.cfg.PingTimeout, qcancel)
	})
	err := blockingLock(qctx, conn, pid, id, shared)
	if !stop() {
		// Given up. Postgres may have granted the lock just as the cancel
		// arrived (err == nil), so clear the connection either way.
		<-cancelled
		kill.Stop()
		l.clearAndClose(conn, pid)
		return nil, context.Cause(wctx)
	}
	if err != nil {
		closeConn(conn)
		return nil, mapError("wait for lock", err)
	}
	if err := l.readyConn(ctx, conn); err != nil {
		l.clearAndClose(conn, pid)
		return nil, err
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.clearAndClose(conn, pid)
		return nil, pgbaton.ErrClosed
	}
	s := l.newSession(conn, pid)
	s.count = 1
	l.sessions = append(l.sessions, s)
	l.mu.Unlock()
	return s, nil
}

func blockingLock(ctx context.Context, conn *pgx.Conn, pid int32, id lockID, shared bool) error {
	q := db.New()
	var n int64
	var err error
	switch {
	case id.pair && shared:
		n, err = q.AdvisoryLockPairShared(ctx, conn, db.AdvisoryLockPairSharedParams{Hi: id.hi, Lo: id.lo, Pid: pid})
	case id.pair:
		n, err = q.AdvisoryLockPair(ctx, conn, db.AdvisoryLockPairParams{Hi: id.hi, Lo: id.lo, Pid: pid})
	case shared:
		n, err = q.AdvisoryLockShared(ctx, conn, db.AdvisoryLockSharedParams{Key: id.id, Pid: pid})
	default:
		n, err = q.AdvisoryLock(ctx, conn, db.AdvisoryLockParams{Key: id.id, Pid: pid})
	}
	if err == nil && n == 0 {
		return fmt.Errorf("%w (wait ran on another backend than %d)", ErrSessionPooling, pid)
	}
	return err
}

// clearAndClose releases whatever advisory locks conn's backend holds,
// then closes it. If the connection is broken, the server releases them
// when it notices the client has gone.
func (l *Locker) clearAndClose(conn *pgx.Conn, pid int32) {
	if !conn.IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.PingTimeout)
		err := releaseAll(ctx, conn, pid)
		cancel()
		if err != nil {
			l.cfg.Logger.Warn("advisory: clearing an abandoned wait failed; the server releases its locks when it notices the closed connection", "err", err)
		}
	}
	closeConn(conn)
}
