package advisory

import (
	"context"
	"fmt"

	"github.com/pgbaton/pgbaton"
)

// wait blocks in pg_advisory_lock on a session of its own: s (a spare),
// or another spare, or a new one. The wait blocks on the caller's
// goroutine with the session's socket taken from its goroutine (see
// pgsession.Conn.Wait); once the lock is granted the session holds it
// (and later other locks too), so the unlock goes out on the same
// connection with no session set up or torn down per acquisition. A wait
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
			var err error
			if s, err = l.openSession(ctx); err != nil {
				return nil, err
			}
			l.mu.Lock()
			closed := l.closed
			l.mu.Unlock()
			if closed {
				s.retire()
				return nil, pgbaton.ErrClosed
			}
		}
		rep, ok := s.Wait(ctx, l.ctx, id, shared)
		if !ok || rep.Stale {
			if spare && attempt < maxSpares && ctx.Err() == nil && l.ctx.Err() == nil {
				s = nil
				continue // the spare went stale while idle: take another
			}
			if !ok {
				<-s.exited
				return nil, fmt.Errorf("advisory: wait for lock: %w", s.Cause())
			}
		}
		if rep.Waited {
			*contended = true
		}
		if rep.Err != nil {
			return nil, rep.Err
		}
		if rep.Waited {
			l.stats.contended.Add(1)
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = s.shutdown(context.Background())
			return nil, pgbaton.ErrClosed
		}
		select {
		case <-s.Done():
			// Lost since the grant, before the Locker knew of it: kept
			// out of the sessions, which it would never leave.
			l.mu.Unlock()
			<-s.exited
			return nil, fmt.Errorf("advisory: wait for lock: %w", s.Cause())
		default:
		}
		s.count = 1
		l.sessions = append(l.sessions, s)
		l.mu.Unlock()
		return s, nil
	}
}
