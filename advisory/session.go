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
// Requests are queued; whoever holds the write token sends everything
// queued at that moment as one batch (group commit) and lets go at once,
// so the next batch can follow while this one is on the wire; whoever
// holds the read token reads the answers, batch by batch in order, until
// its own request is answered. A lone caller takes both in turn and pays
// one round trip without a goroutine hand-off; concurrent callers share
// round trips and keep the server busy (see wire). A pinger goroutine
// pings the server when there was no traffic for a PingInterval. Any
// failure of the connection ends the session and cancels every lock on it.
type session struct {
	l    *Locker
	conn *pgx.Conn
	pid  int32
	w    *wire

	wtok chan struct{} // held (full) while a goroutine sends on the wire
	rtok chan struct{} // held (full) while a goroutine reads from the wire

	qmu     sync.Mutex
	queue   []*request
	ended   bool // no more requests: lost or closing; guarded by qmu
	stopped bool // Close began; guarded by qmu

	fmu      sync.Mutex
	inflight []*batch // sent, not yet read, oldest first; guarded by fmu
	wireDown bool     // the session ended: nothing more goes in flight; guarded by fmu

	// cleanup is the cause of a loss behind a transaction pooler, set by
	// the reader that saw it, for the goroutine that clears the session's
	// first backend (see afterRead).
	cleanup atomic.Pointer[error]

	stop    chan struct{} // closed when the session ends or closes: stops the pinger
	exited  chan struct{} // closed when the pinger returns
	done    chan struct{} // closed when the session is lost or closed
	cause   error         // why done was closed; set before
	endOnce sync.Once

	lastOK atomic.Int64 // l.since() when the last answered batch was sent
	parked bool         // set before end: the connection is kept as a spare

	count  int  // locks held or being taken here; guarded by l.mu
	shared bool // opened for shared use, not for one wait; guarded by l.mu

	pending atomic.Int32 // requests queued or in flight: the pipeline is busy
}

// batch is requests sent together, answered together.
type batch struct {
	reqs     []*request
	sent     time.Duration // l.since() when it was sent
	deadline time.Time     // the answer must have come by then
}

type request struct {
	op     int32
	id     lockID
	result chan result // buffered 1
	sent   atomic.Bool // in a batch on the wire
	done   atomic.Bool // its result is in result (or taken)
}

type result struct {
	ok    bool
	err   error
	retry bool // skipped by the server after an earlier statement failed: send again
}

// answer hands r its result.
func (r *request) answer(res result) {
	r.done.Store(true)
	r.result <- res
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
	if err == nil {
		err = l.readyConn(ctx, conn)
	}
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
		w:      newWire(conn),
		wtok:   make(chan struct{}, 1),
		rtok:   make(chan struct{}, 1),
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
func (s *session) doClaimed(_ context.Context, op int32, id lockID) (bool, error) {
	defer s.pending.Add(-1)
	r := &request{op: op, id: id, result: make(chan result, 1)}
	for {
		if err := s.enqueue(r); err != nil {
			return false, err
		}
		if res := s.await(r); !res.retry {
			return res.ok, res.err
		}
	}
}

func (s *session) enqueue(r *request) error {
	r.sent.Store(false)
	r.done.Store(false)
	s.qmu.Lock()
	switch {
	case s.stopped:
		s.qmu.Unlock()
		return pgbaton.ErrClosed
	case s.ended:
		s.qmu.Unlock()
		return s.err()
	}
	s.queue = append(s.queue, r)
	s.qmu.Unlock()
	return nil
}

// await waits for r's result. Until r is sent, the caller competes for
// the write token and sends what is queued; then for the read token, and
// reads answers in order until its own is in.
func (s *session) await(r *request) result {
	for {
		if !r.sent.Load() {
			select {
			case res := <-r.result:
				return res
			case s.wtok <- struct{}{}:
				if !s.roundTripAlone() {
					s.sendQueued()
				}
				<-s.wtok
				s.afterRead()
			}
			continue
		}
		select {
		case res := <-r.result:
			return res
		case s.rtok <- struct{}{}:
			s.readUntil(r)
			<-s.rtok
			s.afterRead()
		}
	}
}

// roundTripAlone sends a lone request through pgx and waits for the
// answer, when nothing else is queued or on the wire; the caller holds
// the write token. A single caller gains nothing from the wire, and pgx's
// round trip measured about 10% faster than the wire's (1 goroutine
// looping TryLock+Unlock: 9.0–9.9k vs 8.0–8.3k pairs/s). Meanwhile new
// requests queue, and the first of them pipelines when this one is done.
func (s *session) roundTripAlone() bool {
	select {
	case s.rtok <- struct{}{}:
	default:
		return false // a reader is busy: batches are on the wire
	}
	defer func() { <-s.rtok }()
	s.fmu.Lock()
	idle := len(s.inflight) == 0 && !s.wireDown
	s.fmu.Unlock()
	s.qmu.Lock()
	if !idle || len(s.queue) != 1 {
		s.qmu.Unlock()
		return false
	}
	r := s.queue[0]
	s.queue = s.queue[:0]
	s.qmu.Unlock()
	l := s.l
	b := &batch{reqs: []*request{r}, sent: l.since()}
	if s.expired() {
		s.send(b.reqs) // reports the loss
		return true
	}
	l.stats.batches.Add(1)
	l.stats.requests.Add(1)
	out, err := s.pgxRoundTrip(r)
	s.finish(b, out, err)
	return true
}

// pgxRoundTrip runs r on the connection through pgx. The round trip is
// bounded by a deadline on the socket rather than a context: cheaper, and
// pgx treats a deadline hit as a broken connection, which is what it is
// for a session.
func (s *session) pgxRoundTrip(r *request) (batchOutcome, error) {
	nc := s.conn.PgConn().Conn()
	_ = nc.SetDeadline(time.Now().Add(s.l.cfg.PingTimeout))
	defer func() { _ = nc.SetDeadline(time.Time{}) }()
	bg := context.Background()
	name := statement(r)
	var row pgx.Row
	if name == stmtOp {
		row = s.conn.QueryRow(bg, name, r.op, r.id.pair, r.id.hi, r.id.lo, r.id.id, s.pid)
	} else {
		row = s.conn.QueryRow(bg, name, r.id.id, s.pid)
	}
	var ok bool
	err := row.Scan(&ok)
	out := batchOutcome{ok: []bool{ok}, failedAt: -1}
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		out.noRow = true
	case err != nil && errors.As(err, &pgErr) && !s.conn.IsClosed():
		out.failedAt, out.pgErr = 0, pgErr
	case err != nil:
		return out, err
	}
	// Back to the wire: SyncConn only checks, unless pgx buffered more
	// than the answer.
	return out, s.conn.PgConn().SyncConn(bg)
}

// sendQueued sends what is queued; the caller holds the write token.
func (s *session) sendQueued() {
	for {
		s.qmu.Lock()
		n := min(len(s.queue), maxBatch)
		if n == 0 {
			s.qmu.Unlock()
			return
		}
		reqs := slices.Clone(s.queue[:n])
		s.queue = slices.Delete(s.queue, 0, n)
		s.qmu.Unlock()
		s.send(reqs)
	}
}

// send puts reqs on the wire as one batch.
func (s *session) send(reqs []*request) {
	l := s.l
	if s.expired() {
		// The process did not run for longer than the server is guaranteed
		// to keep a silent session (paused, or starved). Whether or not the
		// server kept it, the locks may have been reported lost already:
		// they must stay lost.
		lost := fmt.Errorf("%w: session (backend pid %d) unanswered for more than PingInterval + PingTimeout (%s)", ErrLockLost, s.pid, l.cfg.giveUp())
		l.metrics.renewFailed(countPings(reqs))
		for _, r := range reqs {
			r.answer(result{err: lost})
		}
		s.end(lost)
		return
	}
	b := &batch{reqs: reqs, sent: l.since(), deadline: time.Now().Add(l.cfg.PingTimeout)}
	buf := s.w.encode(s.pid, reqs)
	s.fmu.Lock()
	if s.wireDown {
		s.fmu.Unlock()
		for _, r := range reqs {
			r.answer(result{err: s.cause})
		}
		return
	}
	if len(s.inflight) > 0 {
		l.stats.pipelined.Add(1)
	}
	s.inflight = append(s.inflight, b)
	for _, r := range reqs {
		r.sent.Store(true)
	}
	s.fmu.Unlock()
	l.stats.batches.Add(1)
	l.stats.requests.Add(int64(len(reqs)))
	if err := s.w.write(buf, l.cfg.PingTimeout); err != nil {
		s.end(fmt.Errorf("%w: session connection (backend pid %d) failed: %w", ErrLockLost, s.pid, err))
	}
}

// nextInflight takes the oldest batch on the wire, or nil.
func (s *session) nextInflight() *batch {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	if len(s.inflight) == 0 {
		return nil
	}
	b := s.inflight[0]
	s.inflight[0] = nil
	s.inflight = s.inflight[1:]
	return b
}

// readUntil reads answers until r's is in; the caller holds the read
// token.
func (s *session) readUntil(r *request) {
	for !r.done.Load() {
		b := s.nextInflight()
		if b == nil {
			return
		}
		s.readBatch(b)
	}
}

// drain reads every batch on the wire; the caller holds both tokens.
func (s *session) drain() {
	for b := s.nextInflight(); b != nil; b = s.nextInflight() {
		s.readBatch(b)
	}
}

// readBatch reads the answer to b and hands out the results. Statements
// after one that failed were skipped by the server (one implicit
// transaction up to the Sync); their callers send them again.
func (s *session) readBatch(b *batch) {
	out, err := s.w.read(len(b.reqs), b.deadline)
	s.finish(b, out, err)
}

// finish hands out the answer to b; err means the connection failed.
func (s *session) finish(b *batch, out batchOutcome, err error) {
	l := s.l
	var lost error
	switch {
	case err != nil:
		select {
		case <-s.done:
			lost = s.cause
		default:
			lost = fmt.Errorf("%w: session connection (backend pid %d) failed: %w", ErrLockLost, s.pid, err)
		}
	case out.noRow:
		// A statement's pid guard did not match: it ran on another backend
		// and changed nothing there.
		lost = fmt.Errorf("%w (session backend pid %d)", ErrSessionPooling, s.pid)
	case out.pgErr != nil && out.pgErr.Code == sqlstateInvalidStatementName:
		lost = mapError("session statement", out.pgErr)
	}
	if lost != nil {
		l.metrics.renewFailed(countPings(b.reqs))
		for _, r := range b.reqs {
			r.answer(result{err: lost})
		}
		if err == nil && errors.Is(lost, ErrSessionPooling) {
			// Locks taken before the pooler showed itself sit on the
			// session's first backend, which the pooler now lends to other
			// clients: they are released there before the session ends,
			// once this reader lets go of the wire (afterRead).
			s.qmu.Lock()
			s.ended = true
			s.qmu.Unlock()
			s.cleanup.CompareAndSwap(nil, &lost)
			return
		}
		s.end(lost)
		return
	}
	s.lastOK.Store(int64(b.sent))
	for i, r := range b.reqs {
		switch {
		case out.failedAt < 0 || i < out.failedAt:
			r.answer(result{ok: out.ok[i]})
		case i == out.failedAt:
			r.answer(result{err: mapError("advisory lock", out.pgErr)})
		default:
			r.answer(result{retry: true})
		}
	}
}

// afterRead clears the session's first backend after a reader saw a
// transaction pooler, and ends the session.
func (s *session) afterRead() {
	p := s.cleanup.Swap(nil)
	if p == nil {
		return
	}
	lost := *p
	if s.exclusive(context.Background()) != nil {
		return // ended meanwhile (Close does the same clearing)
	}
	defer s.release()
	s.drain()
	if !s.conn.IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), s.l.cfg.PingTimeout)
		if err := releaseAll(ctx, s.conn, s.pid); err != nil {
			s.l.cfg.Logger.Error("advisory: locks left behind a transaction pooler", "pid", s.pid, "err", err)
		}
		cancel()
	}
	s.end(lost)
}

// exclusive takes both tokens, write first as everywhere, so that nothing
// else uses the connection: then it can be drained and used through pgx.
// It fails when the session ended or ctx did.
func (s *session) exclusive(ctx context.Context) error {
	select {
	case s.wtok <- struct{}{}:
	case <-s.done:
		return s.cause
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	select {
	case s.rtok <- struct{}{}:
		return nil
	case <-s.done:
		<-s.wtok
		return s.cause
	case <-ctx.Done():
		<-s.wtok
		return context.Cause(ctx)
	}
}

func (s *session) release() {
	<-s.rtok
	<-s.wtok
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

// withConn runs fn with the connection to itself, drained (tests).
func (s *session) withConn(fn func(*pgx.Conn)) {
	if s.exclusive(context.Background()) != nil {
		return
	}
	defer s.release()
	s.drain()
	fn(s.conn)
	_ = s.conn.PgConn().SyncConn(context.Background()) // back to the wire
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
		r.answer(result{err: err})
	}
}

// failInflight ends every request on the wire but those a reader took
// (it sees the connection fail) with err, and lets no more go on it.
func (s *session) failInflight(err error) {
	s.fmu.Lock()
	s.wireDown = true
	bs := s.inflight
	s.inflight = nil
	s.fmu.Unlock()
	for _, b := range bs {
		s.l.metrics.renewFailed(countPings(b.reqs))
		for _, r := range b.reqs {
			r.answer(result{err: err})
		}
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
		s.failInflight(cause)
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
	if err := s.exclusive(ctx); err != nil {
		if ctx.Err() == nil {
			<-s.exited // lost: the socket is closed already
			return nil, nil
		}
		s.end(closed)
		return nil, fmt.Errorf("advisory: close session (backend pid %d): %w", s.pid, context.Cause(ctx))
	}
	defer s.release()
	s.failQueued(pgbaton.ErrClosed)
	s.drain() // what is on the wire is answered to its callers
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
