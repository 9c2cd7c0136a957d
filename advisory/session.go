package advisory

import (
	"context"
	"errors"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory/internal/pgsession"
)

// session is a connection the Locker owns (pgsession.Conn: everything
// about the connection and the protocol), with the Locker's books on it.
type session struct {
	*pgsession.Conn
	exited chan struct{} // closed once the Locker knows the connection ended and has cancelled its locks

	count  int  // locks held or being taken here; guarded by Locker.mu
	shared bool // opened for shared use, not for one wait; guarded by Locker.mu
}

// openSession opens a connection for the Locker.
func (l *Locker) openSession(ctx context.Context) (*session, error) {
	c, err := pgsession.Open(ctx, &l.conn)
	if err != nil {
		return nil, err
	}
	if l.reopen.Swap(false) {
		l.cfg.Logger.Info("advisory: session opened again after a lost session", "pid", c.PID())
	} else {
		l.cfg.Logger.Debug("advisory: session opened", "pid", c.PID())
	}
	l.metrics.sessionOpened()
	s := &session{Conn: c, exited: make(chan struct{})}
	go l.watch(s)
	return s, nil
}

// watch waits for s to end (lost or closed): every lock on it is then
// cancelled with the cause, and its keys are free to be taken again.
func (l *Locker) watch(s *session) {
	<-s.Done()
	l.metrics.sessionClosed()
	cause := s.Cause()
	lost, spare := l.sessionEnded(s, cause)
	switch {
	case errors.Is(cause, pgbaton.ErrClosed), spare:
		l.cfg.Logger.Debug("advisory: session closed", "pid", s.PID())
	default:
		l.cfg.Logger.Warn("advisory: session lost; its locks are cancelled with ErrLockLost", "pid", s.PID(), "locks", lost, "error", cause)
	}
	close(s.exited)
}

// shutdown releases every lock of s and closes it (see
// pgsession.Conn.Shutdown); the Locker knows when it returns.
func (s *session) shutdown(ctx context.Context) error {
	err := s.Shutdown(ctx)
	<-s.exited
	return err
}

// retire closes s, idle and holding nothing.
func (s *session) retire() {
	s.Retire()
	<-s.exited
}
