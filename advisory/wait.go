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

// wait blocks in pg_advisory_lock on a connection of its own: oc, or a
// spare, or a new one. Once the lock is granted the connection becomes a
// session holding it (and later other locks too). A wait given up (ctx
// ended, Locker closed) is cancelled on the server; because Postgres may
// grant the lock just as the cancel arrives, the connection then releases
// every advisory lock it holds before it is closed, so nothing is left
// behind. contended is set when the key was held as the wait began.
func (l *Locker) wait(ctx context.Context, id lockID, shared bool, oc *ownedConn, contended *bool) (*session, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		if oc != nil {
			closeConn(oc.conn)
		}
		return nil, pgbaton.ErrClosed
	}
	l.bg.Add(1)
	l.mu.Unlock()
	defer l.bg.Done()

	for attempt := 0; ; attempt++ {
		spare := oc != nil
		if !spare {
			oc, spare = l.takeSpare()
		}
		if !spare {
			var err error
			if oc, err = l.openConn(ctx); err != nil {
				return nil, err
			}
		}
		s, err := l.waitOn(ctx, oc, id, shared, contended)
		var pgErr *pgconn.PgError
		if err != nil && spare && attempt < maxSpares && ctx.Err() == nil && !errors.As(err, &pgErr) && oc.conn.IsClosed() {
			oc = nil
			continue // the spare went stale while idle: take another
		}
		return s, err
	}
}

// waitOn blocks in pg_advisory_lock on oc (see wait).
func (l *Locker) waitOn(ctx context.Context, oc *ownedConn, id lockID, shared bool, contended *bool) (*session, error) {
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
		_ = oc.conn.PgConn().CancelRequest(cctx)
		// If the statement is still running when the cancel should have
		// landed, the server is unreachable: drop the connection.
		kill = time.AfterFunc(l.cfg.PingTimeout, qcancel)
	})
	waited, err := blockingLock(qctx, oc, id, shared)
	if !stop() {
		// Given up. Postgres may have granted the lock just as the cancel
		// arrived (err == nil), so clear the connection either way.
		<-cancelled
		kill.Stop()
		if waited || err != nil {
			*contended = true
		}
		l.clearAndClose(oc)
		return nil, context.Cause(wctx)
	}
	if err != nil {
		closeConn(oc.conn)
		return nil, mapError("wait for lock", err)
	}
	if waited {
		*contended = true
		l.stats.contended.Add(1)
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.clearAndClose(oc)
		return nil, pgbaton.ErrClosed
	}
	s := l.newSession(oc)
	s.count = 1
	l.sessions = append(l.sessions, s)
	l.mu.Unlock()
	return s, nil
}

// blockingLock takes the lock, waiting as long as it takes; waited says
// whether the key was held when the statement began.
func blockingLock(ctx context.Context, oc *ownedConn, id lockID, shared bool) (waited bool, err error) {
	q := db.New()
	switch {
	case id.pair && shared:
		waited, err = q.AdvisoryLockPairShared(ctx, oc.conn, db.AdvisoryLockPairSharedParams{Hi: id.hi, Lo: id.lo, Token: oc.token})
	case id.pair:
		waited, err = q.AdvisoryLockPair(ctx, oc.conn, db.AdvisoryLockPairParams{Hi: id.hi, Lo: id.lo, Token: oc.token})
	case shared:
		waited, err = q.AdvisoryLockShared(ctx, oc.conn, db.AdvisoryLockSharedParams{Key: id.id, Token: oc.token})
	default:
		waited, err = q.AdvisoryLock(ctx, oc.conn, db.AdvisoryLockParams{Key: id.id, Token: oc.token})
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("%w (wait ran on another backend than %d)", ErrSessionPooling, oc.pid)
	}
	return waited, err
}

// clearAndClose releases whatever advisory locks oc's backend holds, then
// closes it. If the connection is broken, the server releases them when
// it notices the client has gone.
func (l *Locker) clearAndClose(oc *ownedConn) {
	if !oc.conn.IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.PingTimeout)
		err := releaseAll(ctx, oc)
		cancel()
		if err != nil {
			l.cfg.Logger.Warn("advisory: clearing an abandoned wait failed; the server releases its locks when it notices the closed connection", "err", err)
		}
	}
	closeConn(oc.conn)
}
