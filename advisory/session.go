package advisory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// Operations a session runs for callers (see queries/advisory.sql).
const (
	opPing         int32 = 0
	opTry          int32 = 1
	opTryShared    int32 = 2
	opUnlock       int32 = 3
	opUnlockShared int32 = 4
)

// maxBatch bounds how many queued requests go into one pipelined batch.
const maxBatch = 256

// session is one connection the Locker owns, holding many locks.
// Requests are queued; whoever holds the connection token sends
// everything queued at that moment as one pipelined batch (group commit),
// so a lone caller pays one round trip without a goroutine hand-off, and
// concurrent callers share round trips. A pinger goroutine pings the
// server when there was no traffic for a PingInterval. Any failure of the
// connection ends the session and cancels every lock on it.
type session struct {
	l    *Locker
	conn *pgx.Conn
	pid  int32

	tok chan struct{} // held (full) while a goroutine uses conn

	qmu     sync.Mutex
	queue   []*request
	ended   bool // no more requests: lost or closing; guarded by qmu
	stopped bool // Close began; guarded by qmu

	stop    chan struct{} // closed when the session ends or closes: stops the pinger
	exited  chan struct{} // closed when the pinger returns
	done    chan struct{} // closed when the session is lost or closed
	cause   error         // why done was closed; set before
	endOnce sync.Once

	lastOK atomic.Int64 // l.since() when the last successful batch was sent
	parked bool         // set before end: the connection is kept as a spare

	count  int  // locks held or being taken here; guarded by l.mu
	shared bool // opened for shared use, not for one wait; guarded by l.mu

	pending atomic.Int32 // requests queued or in flight: the pipeline is busy
}

type request struct {
	op     int32
	id     lockID
	result chan result // buffered 1
}

type result struct {
	ok  bool
	err error
}

// openConn takes a connection out of the pool for good (Hijack: the pool
// forgets it, so MaxConnLifetime and health checks never touch it) and
// prepares it as a session: TCP timeouts, standby and pooler checks.
func (l *Locker) openConn(ctx context.Context) (*pgx.Conn, int32, error) {
	l.stats.connects.Add(1)
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return nil, 0, mapError("open session", err)
	}
	conn := pc.Hijack()
	pid, err := l.setupConn(ctx, conn)
	if err != nil {
		closeConn(conn)
		return nil, 0, err
	}
	return conn, pid, nil
}

func (l *Locker) setupConn(ctx context.Context, conn *pgx.Conn) (int32, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.PingTimeout)
	defer cancel()
	q := db.New()
	st := l.cfg.serverTimeouts()
	row, err := q.AdvisorySessionSetup(ctx, conn, db.AdvisorySessionSetupParams{
		KeepalivesIdle:     strconv.Itoa(st.keepalivesIdle),
		KeepalivesInterval: strconv.Itoa(st.keepalivesInterval),
		KeepalivesCount:    strconv.Itoa(st.keepalivesCount),
		UserTimeout:        strconv.Itoa(st.userTimeout),
	})
	if err != nil {
		return 0, mapError("set up session", err)
	}
	if row.InRecovery {
		return 0, fmt.Errorf("advisory: %w", pgbaton.ErrStandby)
	}
	// A transaction-pooling proxy hands each statement to whichever backend
	// is free; two statements in a row usually show it.
	pid, err := q.AdvisoryBackendPID(ctx, conn)
	if err != nil {
		return 0, mapError("set up session", err)
	}
	if pid != row.Pid {
		return 0, fmt.Errorf("%w (pids %d then %d)", ErrSessionPooling, row.Pid, pid)
	}
	// An idle pooler usually hands the same backend back, so also look from
	// another client connection: a pooler gives it the backend this session
	// just used (PgBouncer reuses the most recent one), which no direct or
	// session-pooled connection can ever see. Done before any lock is
	// taken, so nothing is left on a backend the pooler lends to others.
	// It is skipped when the pool has no connection to spare right now: the
	// probe must not wait on the application's own traffic; the pid guard
	// below still catches a pooler at the first statement.
	if ps := l.pool.Stat(); ps.IdleConns() == 0 && ps.TotalConns() >= ps.MaxConns() {
		return pid, nil
	}
	if probe, err := l.pool.Acquire(ctx); err == nil {
		other, err := q.AdvisoryBackendPID(ctx, probe)
		probe.Release()
		if err == nil && other == pid {
			return 0, fmt.Errorf("%w (two client connections were served by backend %d)", ErrSessionPooling, pid)
		}
	}
	return pid, nil
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// newSession wraps conn and starts its pinger.
func (l *Locker) newSession(conn *pgx.Conn, pid int32) *session {
	s := &session{
		l:      l,
		conn:   conn,
		pid:    pid,
		tok:    make(chan struct{}, 1),
		stop:   make(chan struct{}),
		exited: make(chan struct{}),
		done:   make(chan struct{}),
	}
	s.lastOK.Store(int64(l.since()))
	if l.reopen.Swap(false) {
		l.cfg.Logger.Info("advisory: session opened again after a lost session", "pid", pid)
	} else {
		l.cfg.Logger.Debug("advisory: session opened", "pid", pid)
	}
	l.metrics.sessionOpened()
	go s.pinger()
	return s
}

// expired reports whether the session went longer than PingInterval +
// PingTimeout without an answer: its locks must be treated as lost even if
// the goroutine that would notice has not run (a paused process).
func (s *session) expired() bool {
	return s.l.since()-time.Duration(s.lastOK.Load()) > s.l.cfg.giveUp()
}

func (s *session) alive() bool {
	select {
	case <-s.done:
		return false
	default:
		return !s.expired()
	}
}

func (s *session) err() error {
	<-s.done
	return s.cause
}

// do runs one operation in a batch on the session and waits for its
// result. ctx is not used once the request is queued: a batch is bounded
// by PingTimeout, and the caller must know whether a lock was taken.
func (s *session) do(ctx context.Context, op int32, id lockID) (bool, error) {
	s.pending.Add(1)
	return s.doClaimed(ctx, op, id)
}

// doClaimed is do for a caller that counted its request in s.pending
// already (reserveSession does, so that the next caller sees the session
// busy and picks another).
func (s *session) doClaimed(ctx context.Context, op int32, id lockID) (bool, error) {
	defer s.pending.Add(-1)
	r := &request{op: op, id: id, result: make(chan result, 1)}
	s.qmu.Lock()
	switch {
	case s.stopped:
		s.qmu.Unlock()
		return false, pgbaton.ErrClosed
	case s.ended:
		s.qmu.Unlock()
		return false, s.err()
	}
	s.queue = append(s.queue, r)
	s.qmu.Unlock()
	for {
		select {
		case res := <-r.result:
			return res.ok, res.err
		case s.tok <- struct{}{}:
			select {
			case res := <-r.result: // done by the previous holder's batch
				<-s.tok
				return res.ok, res.err
			default:
			}
			s.runQueued()
			<-s.tok
		}
	}
}

// runQueued sends what is queued as one batch; the caller holds tok.
func (s *session) runQueued() {
	s.qmu.Lock()
	n := min(len(s.queue), maxBatch)
	batch := slices.Clone(s.queue[:n])
	s.queue = slices.Delete(s.queue, 0, n)
	s.qmu.Unlock()
	if len(batch) > 0 {
		s.exec(batch)
	}
}

// pinger pings the session when it was idle for a PingInterval.
func (s *session) pinger() {
	defer close(s.exited)
	l := s.l
	t := time.NewTimer(l.cfg.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if idle := l.since() - time.Duration(s.lastOK.Load()); idle >= l.cfg.PingInterval {
			_, _ = s.do(context.Background(), opPing, lockID{})
		}
		next := l.cfg.PingInterval - (l.since() - time.Duration(s.lastOK.Load()))
		t.Reset(max(next, time.Millisecond))
	}
}

// withConn runs fn with the connection to itself (tests).
func (s *session) withConn(fn func(*pgx.Conn)) {
	s.tok <- struct{}{}
	defer func() { <-s.tok }()
	fn(s.conn)
}

// exec sends batch as one pipeline and hands out the results. Statements
// after one that failed were skipped by the server (one implicit
// transaction up to the Sync); they are queued again, first in line.
func (s *session) exec(batch []*request) {
	l := s.l
	if s.expired() {
		// The process did not run for longer than the server is guaranteed
		// to keep a silent session (paused, or starved). Whether or not the
		// server kept it, the locks may have been reported lost already:
		// they must stay lost.
		lost := fmt.Errorf("%w: session (backend pid %d) unanswered for more than PingInterval + PingTimeout (%s)", ErrLockLost, s.pid, l.cfg.giveUp())
		l.metrics.renewFailed(countPings(batch))
		for _, r := range batch {
			r.result <- result{err: lost}
		}
		s.end(lost)
		return
	}
	sent := l.since()
	l.stats.batches.Add(1)
	l.stats.requests.Add(int64(len(batch)))
	// The round trip is bounded by a deadline on the socket rather than a
	// context: cheaper, and pgx treats a deadline hit as a broken
	// connection, which is what it is for a session.
	nc := s.conn.PgConn().Conn()
	_ = nc.SetDeadline(time.Now().Add(l.cfg.PingTimeout))
	results := make([]result, len(batch))
	var firstErr error
	var lost error
	failedAt := -1
	handle := func(i int, ok bool, err error) {
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			// The statement's pid guard did not match: it ran on another
			// backend and changed nothing there.
			lost = fmt.Errorf("%w (session backend pid %d)", ErrSessionPooling, s.pid)
		case err != nil && firstErr == nil:
			firstErr, failedAt = err, i
		case err != nil:
		default:
			results[i] = result{ok: ok}
		}
	}
	q := db.New()
	bg := context.Background()
	switch r := batch[0]; {
	case len(batch) == 1 && r.op == opTry && !r.id.pair:
		ok, err := q.AdvisoryTryOne(bg, s.conn, db.AdvisoryTryOneParams{Key: r.id.id, Pid: s.pid})
		handle(0, ok, err)
	case len(batch) == 1 && r.op == opUnlock && !r.id.pair:
		ok, err := q.AdvisoryUnlockOne(bg, s.conn, db.AdvisoryUnlockOneParams{Key: r.id.id, Pid: s.pid})
		handle(0, ok, err)
	case len(batch) == 1:
		ok, err := q.AdvisoryOpOne(bg, s.conn, db.AdvisoryOpOneParams{Op: r.op, Pair: r.id.pair, Hi: r.id.hi, Lo: r.id.lo, Key: r.id.id, Pid: s.pid})
		handle(0, ok, err)
	default:
		params := make([]db.AdvisoryOpParams, len(batch))
		for i, r := range batch {
			params[i] = db.AdvisoryOpParams{Op: r.op, Pair: r.id.pair, Hi: r.id.hi, Lo: r.id.lo, Key: r.id.id, Pid: s.pid}
		}
		q.AdvisoryOp(bg, s.conn, params).QueryRow(func(i int, ok bool, err error) {
			handle(i, ok, err)
		})
	}
	_ = nc.SetDeadline(time.Time{})
	var pgErr *pgconn.PgError
	switch {
	case lost != nil:
	case pgCode(firstErr) == sqlstateInvalidStatementName:
		lost = mapError("session statement", firstErr)
	case firstErr != nil && !errors.As(firstErr, &pgErr):
		lost = fmt.Errorf("%w: session connection (backend pid %d) failed: %w", ErrLockLost, s.pid, firstErr)
	case firstErr != nil && s.conn.IsClosed():
		lost = fmt.Errorf("%w: session connection (backend pid %d) closed: %w", ErrLockLost, s.pid, firstErr)
	}
	if lost != nil {
		if errors.Is(lost, ErrSessionPooling) && !s.conn.IsClosed() {
			// Locks taken before the pooler showed itself sit on the
			// session's first backend, which the pooler now lends to other
			// clients: release them there before leaving.
			_ = nc.SetDeadline(time.Now().Add(l.cfg.PingTimeout))
			if err := releaseAll(bg, s.conn, s.pid); err != nil {
				l.cfg.Logger.Error("advisory: locks left behind a transaction pooler", "pid", s.pid, "err", err)
			}
		}
		l.metrics.renewFailed(countPings(batch))
		for _, r := range batch {
			r.result <- result{err: lost}
		}
		s.end(lost)
		return
	}
	s.lastOK.Store(int64(sent))
	var again []*request
	for i, r := range batch {
		switch {
		case failedAt < 0 || i < failedAt:
			r.result <- results[i]
		case i == failedAt:
			r.result <- result{err: mapError("advisory lock", firstErr)}
		default:
			again = append(again, r)
		}
	}
	if len(again) > 0 {
		s.qmu.Lock()
		s.queue = append(again, s.queue...)
		s.qmu.Unlock()
	}
}

// countPings counts the pings in batch: a lost batch's pings are the
// session's renew failures.
func countPings(batch []*request) int {
	n := 0
	for _, r := range batch {
		if r.op == opPing {
			n++
		}
	}
	return n
}

// failQueued ends every queued request with err.
func (s *session) failQueued(err error) {
	s.qmu.Lock()
	q := s.queue
	s.queue = nil
	s.qmu.Unlock()
	for _, r := range q {
		r.result <- result{err: err}
	}
}

// end marks the session lost (or closed) once, closes its connection and
// tells the Locker, which cancels the session's locks.
func (s *session) end(cause error) {
	s.endOnce.Do(func() {
		s.qmu.Lock()
		s.ended = true
		s.qmu.Unlock()
		s.cause = cause
		close(s.done)
		close(s.stop)
		s.failQueued(cause)
		s.l.metrics.sessionClosed()
		lost := s.l.sessionEnded(s, cause)
		if errors.Is(cause, pgbaton.ErrClosed) {
			s.l.cfg.Logger.Debug("advisory: session closed", "pid", s.pid)
		} else {
			s.l.cfg.Logger.Warn("advisory: session lost; its locks are cancelled with ErrLockLost", "pid", s.pid, "locks", lost, "err", cause)
		}
		// A goroutine may be blocked on the connection; a hard close of the
		// socket unblocks it and tells the server at once if the network
		// still works. A parked session's connection lives on as a spare.
		if nc := s.conn.PgConn().Conn(); nc != nil && !s.parked {
			_ = nc.Close()
		}
	})
}

// shutdown stops the session for Close: it waits for the batch on the
// wire, then releases every lock explicitly before closing the
// connection, so that nothing is left in pg_locks when Close returns.
func (s *session) shutdown(ctx context.Context) error {
	_, err := s.stopSession(ctx, false)
	return err
}

// park stops an idle session but keeps its connection, cleared of locks,
// for a later blocking wait; nil if that was not possible.
func (s *session) park() *pgx.Conn {
	conn, _ := s.stopSession(context.Background(), true)
	return conn
}

func (s *session) stopSession(ctx context.Context, keep bool) (*pgx.Conn, error) {
	s.qmu.Lock()
	s.stopped = true
	s.qmu.Unlock()
	closed := fmt.Errorf("%w: %w", ErrLockLost, pgbaton.ErrClosed)
	select {
	case s.tok <- struct{}{}:
	case <-s.done:
	case <-ctx.Done():
		s.end(closed)
		return nil, fmt.Errorf("advisory: close session (backend pid %d): %w", s.pid, context.Cause(ctx))
	}
	s.failQueued(pgbaton.ErrClosed)
	var err error
	var kept *pgx.Conn
	select {
	case <-s.done: // lost: the socket is closed already
	default:
		ctx, cancel := context.WithTimeout(ctx, s.l.cfg.PingTimeout)
		if e := releaseAll(ctx, s.conn, s.pid); e != nil {
			err = fmt.Errorf("advisory: release locks of session (backend pid %d): %w", s.pid, e)
		}
		if keep && err == nil {
			s.parked, kept = true, s.conn
		} else {
			_ = s.conn.Close(ctx)
		}
		cancel()
		s.end(closed)
	}
	<-s.exited
	return kept, err
}

// releaseAll releases every advisory lock of the backend pid through conn.
// The statement is guarded by the pid, so behind a transaction pooler,
// where it may land on any backend, it is repeated a few times until it
// reaches the right one; elsewhere the first attempt does it.
func releaseAll(ctx context.Context, conn *pgx.Conn, pid int32) error {
	for range 20 {
		n, err := db.New().AdvisoryUnlockAll(ctx, conn, pid)
		if pgCode(err) == sqlstateQueryCanceled {
			continue // a late cancel request of a given-up wait hit this one
		}
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
	}
	return fmt.Errorf("%w: could not reach backend %d again to release its locks; they stay until the pooler closes that server connection", ErrSessionPooling, pid)
}
