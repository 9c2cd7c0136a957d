package advisory

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory/internal/pgsession"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/pgerr"
)

const (
	// maxBatch bounds how many queued requests go into one batch.
	maxBatch = 256
	// maxInflight bounds the batches on the wire at once.
	maxInflight = 4
)

// session is one connection the Locker owns, holding many locks. One
// goroutine (run) owns the connection for the session's whole life: it
// takes requests from callers over a channel, sends whatever is queued as
// one batch, keeps up to maxInflight batches on the wire so that the
// server always has the next one, reads the answers in order and hands
// each caller its own, pings when the session was idle for a
// PingInterval, and on any failure answers everything pending with the
// cause and ends the session, which cancels every lock on it. Callers
// never touch the connection; what else must run on it (a blocking wait,
// releasing everything, closing it) is a control request the goroutine
// runs between batches.
type session struct {
	*ownedConn
	hooks sessionHooks
	w     wire

	reqs     chan *request
	ctl      chan *control
	kill     chan struct{} // closed by abort
	killOnce sync.Once
	killErr  error // why abort was called; set before kill is closed

	dead   chan struct{} // closed once no more requests run: lost or closed
	exited chan struct{} // closed when the goroutine is done and the Locker knows
	cause  error         // why the session ended; set before dead is closed

	lastOK  atomic.Int64 // since() when the last answered batch was sent
	pending atomic.Int32 // requests queued or on the wire: the pipeline is busy
	dirty   atomic.Bool  // an unlock found nothing held: clear the backend before reuse

	count  int  // locks held or being taken here; guarded by Locker.mu
	shared bool // opened for shared use, not for one wait; guarded by Locker.mu
}

// sessionHooks is all a session needs of its Locker.
type sessionHooks struct {
	cfg     Config
	since   func() time.Duration // monotonic clock
	stats   *counters
	metrics *metrics
	// ended is told once, from the session's goroutine, that the session
	// is over (lost or closed), before exited is closed; it
	// returns the number of locks that went with it, and whether it was
	// an idle spare (whose end costs nothing).
	ended func(s *session, cause error) (lost int, spare bool)
}

type request struct {
	op     pgsession.Op
	id     lockID
	result chan result // buffered 1
}

type result struct {
	ok    bool
	err   error
	retry bool // skipped by the server after an earlier statement failed: send again
}

// batch is requests sent together, answered together.
type batch struct {
	reqs     []*request
	sent     time.Duration // since() when it was sent
	deadline time.Time     // the answer must have come by then
}

// control is work the goroutine does with the connection to itself,
// between batches.
type control struct {
	kind  controlKind
	ctx   context.Context
	fn    func(*ownedConn) // controlFunc
	reply chan controlReply

	// controlWait: the lock to wait for, and the Locker's context (its
	// end gives the wait up, like ctx's).
	id         lockID
	sharedLock bool
	stop       context.Context
}

type controlKind int

const (
	controlShutdown controlKind = iota // release everything, close
	controlRetire                      // stop and close: an idle spare, holding nothing
	controlFunc                        // run fn with the connection (tests)
	controlWait                        // block until the lock is granted (see runWait)
)

type controlReply struct {
	err error

	// controlWait: the key was held when the wait began; the connection
	// had failed before the wait could run (a spare gone stale).
	waited, stale bool
}

// newSession starts a session on oc.
func (l *Locker) newSession(oc *ownedConn) *session {
	s := &session{
		ownedConn: oc,
		hooks:     sessionHooks{cfg: l.cfg, since: l.since, stats: &l.stats, metrics: &l.metrics, ended: l.sessionEnded},
		w:         newWire(oc),
		reqs:      make(chan *request, maxBatch),
		ctl:       make(chan *control),
		kill:      make(chan struct{}),
		dead:      make(chan struct{}),
		exited:    make(chan struct{}),
	}
	s.lastOK.Store(int64(l.since()))
	if l.reopen.Swap(false) {
		l.cfg.Logger.Info("advisory: session opened again after a lost session", "pid", oc.pid)
	} else {
		l.cfg.Logger.Debug("advisory: session opened", "pid", oc.pid)
	}
	l.metrics.sessionOpened()
	go s.run()
	return s
}

// expired reports whether the session went longer than PingInterval +
// PingTimeout without an answer: its locks must be treated as lost even if
// the goroutine that would notice has not run (a paused process).
func (s *session) expired() bool {
	return s.hooks.since()-time.Duration(s.lastOK.Load()) > s.hooks.cfg.giveUp()
}

func (s *session) alive() bool {
	select {
	case <-s.dead:
		return false
	default:
		return !s.expired()
	}
}

func (s *session) lostErr() error {
	return fmt.Errorf("%w: session (backend pid %d) unanswered for more than PingInterval + PingTimeout (%s)", ErrLockLost, s.pid, s.hooks.cfg.giveUp())
}

// do runs one operation on the session and waits for its result. The
// caller must know whether a lock was taken, so there is no context: the
// wait is bounded by PingTimeout, after which the session is lost.
func (s *session) do(op pgsession.Op, id lockID) (bool, error) {
	s.pending.Add(1)
	return s.doClaimed(op, id)
}

// doClaimed is do for a caller that counted its request in s.pending
// already (reserveSession does, so that the next caller sees the session
// busy and picks another).
func (s *session) doClaimed(op pgsession.Op, id lockID) (bool, error) {
	defer s.pending.Add(-1)
	r := &request{op: op, id: id, result: make(chan result, 1)}
	for {
		select {
		case s.reqs <- r:
		case <-s.dead:
			return false, s.cause
		}
		var res result
		select {
		case res = <-r.result:
		case <-s.dead:
			// Every request the goroutine took was answered before dead
			// was closed; one still in the channel never ran.
			select {
			case res = <-r.result:
			default:
				return false, s.cause
			}
		}
		if !res.retry {
			return res.ok, res.err
		}
	}
}

// abort ends the session from outside its goroutine (a caller that found
// it expired, a Close that ran out of time): the socket is closed, which
// ends whatever I/O the goroutine is in.
func (s *session) abort(cause error) {
	select {
	case <-s.dead:
		return
	default:
	}
	s.killOnce.Do(func() {
		s.killErr = cause
		close(s.kill)
		_ = s.w.nc.Close()
	})
}

// run is the session's goroutine.
func (s *session) run() {
	cfg := s.hooks.cfg
	ping := time.NewTimer(cfg.PingInterval)
	defer ping.Stop()
	// Watching the socket while idle (idleWatch) starts after
	// idleWatchAfter of idleness.
	watchT := time.NewTimer(time.Hour)
	watchT.Stop()
	defer watchT.Stop()
	var watch *idleWatch
	// Without a descriptor to wait on (other systems, custom dialers) the
	// session relies on its pings alone and never arms the watch timer.
	watchable := canWatchIdle && rawConnOf(s.w.nc) != nil
	defer func() {
		if watch != nil {
			watch.stop()
		}
	}()
	var (
		queue    []*request // taken from callers, not sent yet
		inflight []*batch   // sent, oldest first
		pending  *control   // taken, waiting for the wire to drain
	)
	for {
		if pending != nil && len(inflight) == 0 {
			var over bool
			if queue, over = s.control(pending, queue); over {
				return
			}
			pending = nil
			continue
		}
		if pending == nil && len(queue) == 0 && len(inflight) == 0 {
			queue = s.linger(queue)
		}
		if pending == nil && len(queue) == 0 && len(inflight) == 0 {
			if watchable && watch == nil {
				watchT.Reset(idleWatchAfter)
			}
			var readable <-chan struct{}
			if watch != nil {
				readable = watch.readable
			}
			select {
			case <-watchT.C:
				watch = startIdleWatch(s.w.nc)
				continue
			case <-readable:
				// The server sent something unasked: it is ending the
				// session, most likely. A ping reads it now.
				<-watch.done
				watch = nil
				cfg.Logger.Debug("advisory: the server sent to an idle session; pinging now", "pid", s.pid)
				queue = append(queue, &request{op: pgsession.Ping, result: make(chan result, 1)})
				continue
			case r := <-s.reqs:
				queue = append(queue, r)
			case <-ping.C:
				idle := s.hooks.since() - time.Duration(s.lastOK.Load())
				if idle >= cfg.PingInterval {
					queue = append(queue, &request{op: pgsession.Ping, result: make(chan result, 1)})
					idle = 0
				}
				ping.Reset(max(cfg.PingInterval-idle, time.Millisecond))
			case c := <-s.ctl:
				pending = c
			case <-s.kill:
				if watch != nil {
					watch.stop() // before finish: nothing outlives the session
					watch = nil
				}
				s.finish(s.killErr, queue, inflight)
				return
			}
			// Busy again: the socket is the goroutine's alone.
			watchT.Stop()
			if watch != nil {
				watch.stop()
				watch = nil
			}
			continue
		}
		if pending == nil {
			select {
			case pending = <-s.ctl:
			default:
				queue = s.takeQueued(queue)
			}
		}
		if pending != nil && pending.kind == controlShutdown {
			// Closing: what is not on the wire yet does not go.
			s.failQueue(queue, pgbaton.ErrClosed)
			queue = nil
		}
		if pending == nil && len(queue) > 0 && len(inflight) < maxInflight {
			if len(inflight) > 0 {
				s.hooks.stats.pipelined.Add(1)
			}
			n := min(len(queue), maxBatch)
			b, err := s.send(queue[:n])
			queue = queue[n:]
			if err != nil {
				s.finish(err, queue, inflight)
				return
			}
			inflight = append(inflight, b)
			continue // more may have come meanwhile: they go before the read
		}
		if len(inflight) == 0 {
			continue
		}
		b := inflight[0]
		inflight[0] = nil
		inflight = inflight[1:]
		if err := s.receive(b); err != nil {
			if errors.Is(err, ErrSessionPooling) {
				s.leavePooler(err, queue, inflight)
			} else {
				s.finish(err, queue, inflight)
			}
			s.dropControl(pending)
			return
		}
	}
}

// linger yields the processor a few times before the goroutine blocks
// for work: the callers just answered run first, and the next request of
// a caller that locks and unlocks in a row is then taken without the
// goroutine being parked and woken again (a futex wake-up and a context
// switch each time: with one goroutine looping TryLock+Unlock, perf stat
// counted about a fifth fewer context switches above raw pgx's).
func (s *session) linger(queue []*request) []*request {
	for range lingerYields {
		runtime.Gosched()
		select {
		case r := <-s.reqs:
			return append(queue, r)
		default:
		}
	}
	return queue
}

// lingerYields is how often linger yields.
const lingerYields = 2

// takeQueued appends what callers queued meanwhile, without waiting.
func (s *session) takeQueued(queue []*request) []*request {
	for len(queue) < maxBatch {
		select {
		case r := <-s.reqs:
			queue = append(queue, r)
		default:
			return queue
		}
	}
	return queue
}

// send puts reqs on the wire as one batch; an error ends the session.
func (s *session) send(reqs []*request) (*batch, error) {
	h := s.hooks
	if s.expired() {
		// The process did not run for longer than the server is guaranteed
		// to keep a silent session (paused, or starved). Whether or not the
		// server kept it, the locks may have been reported lost already:
		// they must stay lost.
		return nil, s.withBatch(reqs, s.lostErr())
	}
	b := &batch{reqs: reqs, sent: h.since(), deadline: time.Now().Add(h.cfg.PingTimeout)}
	h.stats.batches.Add(1)
	h.stats.requests.Add(int64(len(reqs)))
	if err := s.w.write(s.w.encode(reqs), h.cfg.PingTimeout); err != nil {
		return nil, s.withBatch(reqs, s.failure(err))
	}
	return b, nil
}

// withBatch answers reqs with err and returns it.
func (s *session) withBatch(reqs []*request, err error) error {
	s.hooks.metrics.renewFailed(countPings(reqs))
	for _, r := range reqs {
		r.result <- result{err: err}
	}
	return err
}

// failure is the cause of a session that failed on I/O: what abort said,
// if it was aborted.
func (s *session) failure(err error) error {
	select {
	case <-s.kill:
		return s.killErr
	default:
	}
	return fmt.Errorf("%w: session connection (backend pid %d) failed: %w", ErrLockLost, s.pid, err)
}

// receive reads the answer to b and hands out the results. Statements
// after one that failed were skipped by the server (one implicit
// transaction up to the Sync); their callers send them again. An error
// ends the session; b's requests have been answered with it.
func (s *session) receive(b *batch) error {
	out, err := s.w.read(b.reqs, b.deadline)
	var lost error
	switch {
	case err != nil:
		lost = s.failure(err)
	case out.noRow:
		// A statement's token guard did not match: it ran on another
		// backend, or a pooler lent this one to another session, and
		// changed nothing there.
		lost = fmt.Errorf("%w: %w (session backend pid %d)", ErrLockLost, ErrSessionPooling, s.pid)
	case out.pgErr != nil && out.pgErr.Code == pgerr.InvalidStatementName:
		lost = fmt.Errorf("%w: %w", ErrLockLost, mapError("session statement", out.pgErr))
	}
	if lost != nil {
		return s.withBatch(b.reqs, lost)
	}
	s.lastOK.Store(int64(b.sent))
	for i, r := range b.reqs {
		pgErr, retry := out.answer(i)
		switch {
		case retry:
			r.result <- result{retry: true}
		case pgErr != nil:
			r.result <- result{err: mapError("advisory lock", pgErr)}
		default:
			if !out.ok[i] && (r.op == pgsession.Unlock || r.op == pgsession.UnlockShared) {
				s.dirty.Store(true)
			}
			r.result <- result{ok: out.ok[i]}
		}
	}
	return nil
}

// failQueue answers requests that were not sent with err.
func (s *session) failQueue(queue []*request, err error) {
	for _, r := range queue {
		r.result <- result{err: err}
	}
}

// drainWire reads every batch on the wire and answers its requests with
// cause: their outcome does not matter any more, as the backend is
// cleared next. It reports whether the connection is still usable.
func (s *session) drainWire(inflight []*batch, cause error) bool {
	for i, b := range inflight {
		_, err := s.w.read(b.reqs, b.deadline)
		s.failQueue(b.reqs, cause)
		if err != nil {
			for _, rest := range inflight[i+1:] {
				s.failQueue(rest.reqs, cause)
			}
			return false
		}
	}
	return true
}

// leavePooler ends a session that found itself behind a transaction
// pooler. Locks taken before the pooler showed itself sit on the session's
// first backend, which the pooler lends to other clients: they are
// released there (the token guard finds that backend, if the pooler lets
// it be reached again) before the connection is closed.
func (s *session) leavePooler(cause error, queue []*request, inflight []*batch) {
	s.failQueue(queue, cause)
	if s.drainWire(inflight, cause) {
		ctx, cancel := context.WithTimeout(context.Background(), s.hooks.cfg.PingTimeout)
		if err := releaseAll(ctx, s.ownedConn); err != nil {
			s.hooks.cfg.Logger.Error("advisory: locks left behind a transaction pooler", "pid", s.pid, "error", err)
		}
		cancel()
	}
	s.finish(cause, nil, nil)
}

// control runs c with nothing on the wire; it reports whether the session
// is over. queue holds requests not sent yet (a shutdown answers them); a
// wait may put one in front of them.
func (s *session) control(c *control, queue []*request) ([]*request, bool) {
	if s.expired() && c.kind != controlShutdown {
		s.finish(s.lostErr(), queue, nil)
		c.reply <- controlReply{err: s.lostErr(), stale: true}
		return nil, true
	}
	switch c.kind {
	case controlWait:
		rep, goOn, owed := s.runWait(c)
		if !goOn {
			// Given up or failed: the backend was cleared (or is gone).
			s.finish(fmt.Errorf("%w: %w", ErrLockLost, pgbaton.ErrClosed), queue, nil)
		}
		c.reply <- rep
		if owed != nil {
			// Sent before any unlock of the caller's can be.
			queue = append([]*request{owed}, queue...)
		}
		return queue, !goOn
	case controlFunc:
		c.fn(s.ownedConn)
		c.reply <- controlReply{}
		return queue, false
	case controlRetire:
		// Closing the connection ends the backend and whatever it held.
		s.finish(fmt.Errorf("%w: %w", ErrLockLost, pgbaton.ErrClosed), queue, nil)
		c.reply <- controlReply{}
		return nil, true
	default: // controlShutdown
		closed := fmt.Errorf("%w: %w", ErrLockLost, pgbaton.ErrClosed)
		s.failQueue(queue, pgbaton.ErrClosed)
		ctx, cancel := context.WithTimeout(c.ctx, s.hooks.cfg.PingTimeout)
		var err error
		if e := releaseAll(ctx, s.ownedConn); e != nil {
			err = fmt.Errorf("advisory: release locks of session (backend pid %d): %w", s.pid, e)
		}
		_ = s.conn.Close(ctx)
		cancel()
		s.finish(closed, nil, nil)
		c.reply <- controlReply{err: err}
		return nil, true
	}
}

// dropControl answers a control that was taken but never ran because the
// session ended first (its caller waits for an answer): a wait may try
// another session.
func (s *session) dropControl(c *control) {
	if c == nil {
		return
	}
	rep := controlReply{stale: true}
	if c.kind == controlWait {
		rep.err = s.cause
	}
	c.reply <- rep
}

// finish ends the session: every request taken is answered with cause,
// the connection is closed, and the Locker cancels the session's locks.
func (s *session) finish(cause error, queue []*request, inflight []*batch) {
	s.failQueue(queue, cause)
	for _, b := range inflight {
		_ = s.withBatch(b.reqs, cause)
	}
	s.cause = cause
	close(s.dead)
	// Requests that came in since never run.
	for {
		select {
		case r := <-s.reqs:
			r.result <- result{err: cause}
			continue
		default:
		}
		break
	}
	// A hard close of the socket tells the server at once if the network
	// still works.
	_ = s.w.nc.Close()
	s.hooks.metrics.sessionClosed()
	lost, spare := s.hooks.ended(s, cause)
	switch {
	case errors.Is(cause, pgbaton.ErrClosed), spare:
		s.hooks.cfg.Logger.Debug("advisory: session closed", "pid", s.pid)
	default:
		s.hooks.cfg.Logger.Warn("advisory: session lost; its locks are cancelled with ErrLockLost", "pid", s.pid, "locks", lost, "error", cause)
	}
	close(s.exited)
}

// sendControl sends c to the goroutine and waits for its reply; false if the
// session ended first.
func (s *session) sendControl(c *control) (controlReply, bool) {
	c.reply = make(chan controlReply, 1)
	select {
	case s.ctl <- c:
	case <-s.dead:
		return controlReply{}, false
	}
	return <-c.reply, true
}

// shutdown stops the session for Close: what is on the wire is answered,
// then every lock is released explicitly before the connection closes,
// so that nothing is left in pg_locks when Close returns. ctx bounds it.
func (s *session) shutdown(ctx context.Context) error {
	c := &control{kind: controlShutdown, ctx: ctx, reply: make(chan controlReply, 1)}
	select {
	case s.ctl <- c:
	case <-s.dead:
		<-s.exited
		return nil // lost already: the socket is closed
	case <-ctx.Done():
		s.abort(fmt.Errorf("%w: %w", ErrLockLost, pgbaton.ErrClosed))
		<-s.exited
		return fmt.Errorf("advisory: close session (backend pid %d): %w", s.pid, context.Cause(ctx))
	}
	select {
	case rep := <-c.reply:
		<-s.exited
		return rep.err
	case <-ctx.Done():
		s.abort(fmt.Errorf("%w: %w", ErrLockLost, pgbaton.ErrClosed))
		<-s.exited
		return fmt.Errorf("advisory: close session (backend pid %d): %w", s.pid, context.Cause(ctx))
	}
}

// retire stops an idle session that holds nothing and closes its
// connection.
func (s *session) retire() {
	s.sendControl(&control{kind: controlRetire, ctx: context.Background()})
	<-s.exited
}

// withConn runs fn with the connection to itself, between batches.
func (s *session) withConn(fn func(*ownedConn)) {
	s.sendControl(&control{kind: controlFunc, fn: fn, ctx: context.Background()})
}

// countPings counts the pings in batch: a lost batch's pings are the
// session's renew failures.
func countPings(batch []*request) int {
	n := 0
	for _, r := range batch {
		if r.op == pgsession.Ping {
			n++
		}
	}
	return n
}

// releaseAll releases every advisory lock of oc's backend. The statement
// is guarded by the token, so behind a transaction pooler, where it may
// land on any backend, it is repeated a few times until it reaches the
// right one; elsewhere the first attempt does it.
func releaseAll(ctx context.Context, oc *ownedConn) error {
	for range 20 {
		n, err := db.New().AdvisoryUnlockAll(ctx, simpleProtocol{oc.conn}, oc.token)
		if pgerr.Code(err) == pgerr.QueryCanceled {
			continue // a late cancel request of a given-up wait hit this one
		}
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
	}
	return fmt.Errorf("%w: could not reach backend %d again to release its locks; they stay until the pooler closes that server connection", ErrSessionPooling, oc.pid)
}
