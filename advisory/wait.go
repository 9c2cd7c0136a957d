package advisory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory/internal/pgsession"
	"github.com/pgbaton/pgbaton/internal/db"
)

// wait blocks in pg_advisory_lock on a session of its own: s (a spare),
// or another spare, or a new one. The session's goroutine runs the wait
// (see session.runWait); once the lock is granted the session holds it
// (and later other locks too), so the unlock goes out on the same
// goroutine with no session set up or torn down per acquisition. A wait
// given up (ctx ended, Locker closed) is cancelled on the server and its
// session ends: because Postgres may grant the lock just as the cancel
// arrives, the connection releases every advisory lock it holds before it
// is closed, so nothing is left behind. contended is set when the key was
// held as the wait began.
func (l *Locker) wait(ctx context.Context, id lockID, shared bool, s *session, contended *bool) (*session, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		if s != nil {
			l.dropSpare(s)
		}
		return nil, pgbaton.ErrClosed
	}
	l.bg.Add(1)
	l.mu.Unlock()
	defer l.bg.Done()

	for attempt := 0; ; attempt++ {
		spare := s != nil
		if !spare {
			s, spare = l.takeSpare()
		}
		if !spare {
			oc, err := l.openConn(ctx)
			if err != nil {
				return nil, err
			}
			l.mu.Lock()
			if l.closed {
				l.mu.Unlock()
				closeConn(oc.conn)
				return nil, pgbaton.ErrClosed
			}
			s = l.newSession(oc)
			l.mu.Unlock()
		}
		rep, ok := s.sendControl(&control{kind: controlWait, ctx: ctx, stop: l.ctx, id: id, sharedLock: shared})
		if !ok || rep.stale {
			if spare && attempt < maxSpares && ctx.Err() == nil && l.ctx.Err() == nil {
				s = nil
				continue // the spare went stale while idle: take another
			}
			if !ok {
				<-s.exited
				return nil, fmt.Errorf("advisory: wait for lock: %w", s.cause)
			}
		}
		if rep.waited {
			*contended = true
		}
		if rep.err != nil {
			return nil, rep.err
		}
		if rep.waited {
			l.stats.contended.Add(1)
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = s.shutdown(context.Background())
			return nil, pgbaton.ErrClosed
		}
		select {
		case <-s.dead:
			// Lost since the grant, before the Locker knew of it: kept
			// out of the sessions, which it would never leave.
			l.mu.Unlock()
			<-s.exited
			return nil, fmt.Errorf("advisory: wait for lock: %w", s.cause)
		default:
		}
		s.count = 1
		l.sessions = append(l.sessions, s)
		l.mu.Unlock()
		return s, nil
	}
}

// runWait blocks in pg_advisory_lock on the session's connection, from
// its goroutine, with nothing else on the wire. It reports whether the
// session goes on: only when the lock was granted to a caller still
// waiting for it; and an unlock owed when the backend took the key twice
// (fastWait), for the session to send before anything else.
//
// The statement runs under its own context: cancelling it through pgx
// would close the connection, and the server would release a lock granted
// in the meantime only when it notices, some time later. Instead, when the
// caller gives up (or Close is called), a cancel request stops the wait on
// the server and the backend is cleared before the session ends.
func (s *session) runWait(c *control) (_ controlReply, goOn bool, owed *request) {
	pingTimeout := s.hooks.cfg.PingTimeout
	wctx, wcancel := context.WithCancelCause(c.ctx)
	defer wcancel(nil)
	stopClose := context.AfterFunc(c.stop, func() { wcancel(pgbaton.ErrClosed) })
	defer stopClose()
	qctx, qcancel := context.WithCancel(context.Background())
	defer qcancel()
	cancelled := make(chan struct{})
	var kill *time.Timer // written before cancelled is closed
	stop := context.AfterFunc(wctx, func() {
		defer close(cancelled)
		cctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
		defer cancel()
		_ = s.conn.PgConn().CancelRequest(cctx)
		// If the statement is still running when the cancel should have
		// landed, the server is unreachable: drop the connection.
		kill = time.AfterFunc(pingTimeout, qcancel)
	})
	waited, extra, err := blockingLock(qctx, s.ownedConn, c.id, c.sharedLock)
	if !stop() {
		// Given up. Postgres may have granted the lock just as the cancel
		// arrived (err == nil), so clear the backend either way.
		<-cancelled
		kill.Stop()
		s.clearBackend()
		return controlReply{err: context.Cause(wctx), waited: waited || err != nil}, false, nil
	}
	if err != nil {
		// A connection that failed (or that the server ended: FATAL)
		// took nothing with it: another one can wait instead.
		return controlReply{err: mapError("wait for lock", err), stale: s.conn.IsClosed()}, false, nil
	}
	s.lastOK.Store(int64(s.hooks.since()))
	if extra {
		op := pgsession.Unlock
		if c.sharedLock {
			op = pgsession.UnlockShared
		}
		owed = &request{op: op, id: c.id, result: make(chan result, 1)}
	}
	return controlReply{waited: waited}, true, owed
}

// blockingLock takes the lock, waiting as long as it takes; waited says
// whether the key was held when the wait began, extra that the backend
// holds it twice (fastWait).
func blockingLock(ctx context.Context, oc *ownedConn, id lockID, shared bool) (waited, extra bool, err error) {
	if oc.fast != nil {
		return fastWait(ctx, oc, id, shared)
	}
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
		return false, false, fmt.Errorf("%w (wait ran on another backend than %d)", ErrSessionPooling, oc.pid)
	}
	return waited, false, err
}

// clearBackend releases whatever advisory locks the session's backend
// holds, before the session ends. If the connection is broken, the server
// releases them when it notices the client has gone.
func (s *session) clearBackend() {
	if s.conn.IsClosed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.hooks.cfg.PingTimeout)
	err := releaseAll(ctx, s.ownedConn)
	cancel()
	if err != nil {
		s.hooks.cfg.Logger.Warn("advisory: clearing an abandoned wait failed; the server releases its locks when it notices the closed connection", "error", err)
	}
}
