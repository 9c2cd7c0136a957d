package pgsession

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/pgerr"
)

const (
	// maxBatch bounds how many queued requests go into one batch.
	maxBatch = 256
	// maxInflight bounds the batches on the wire at once.
	maxInflight = 4
)

// Conn is one connection a Locker owns, holding many locks. One
// goroutine (run) keeps the connection for its whole life: it takes
// requests from callers over a channel, sends whatever is queued as one
// batch, keeps up to maxInflight batches on the wire so that the server
// always has the next one, reads the answers in order and hands each
// caller its own, pings when the connection was idle for a PingInterval,
// and on any failure answers everything pending with the cause and ends,
// which closes Done: every lock on it is lost. What else must run on it
// (releasing everything, closing it) is a control request the goroutine
// runs between batches.
//
// While it has nothing to do, the goroutine lends the socket: a caller
// alone on the session that finds it free (free holds the token) sends
// its request and reads the answer on its own goroutine, as raw pgx
// does, and gives the token back; a wait takes the socket the same way,
// borrowing it from the goroutine if need be, and blocks on it until the
// grant. Handing each request to the goroutine and each answer back
// wakes a goroutine twice per round trip, on the critical path of every
// handover of a contended key. Callers that are not alone, or find the
// socket taken, queue their requests, and the goroutine, once it has the
// token back, pipelines them as above: a caller on the socket holds the
// others back for its round trip, where the goroutine would have put
// theirs on the wire behind it. The goroutine keeps the token while
// it has work, and while it watches the idle socket (idleWatch). Only
// direct connections (the fast path) lend: behind a pooler a statement
// may fail in ways only the goroutine handles (leavePooler).
type Conn struct {
	cfg   *Config
	conn  *pgx.Conn
	pid   int32
	token string // set on the backend; every session statement checks it
	names Statements
	fast  *Fast // set on a direct connection: function calls, not statements
	w     wire
	epoch time.Time // monotonic base of lastOK

	reqs     chan *request
	ctl      chan *control
	free     chan struct{} // holds the token while the socket is lent: take it to use the socket
	kill     chan struct{} // closed by Abort
	killOnce sync.Once
	killErr  error // why Abort was called; set before kill is closed

	dead   chan struct{} // closed once no more requests run: lost or closed
	exited chan struct{} // closed when the goroutine is done (Done)
	cause  error         // why the connection ended; set before dead is closed

	lastOK  atomic.Int64 // since() when the last answered batch was sent
	rtt     atomic.Int64 // how long the last answered batch took (see waitedAfter)
	pending atomic.Int32 // requests queued or on the wire: the pipeline is busy
	dirty   atomic.Bool  // an unlock found nothing held: clear the backend before reuse
}

type request struct {
	op     Op
	id     Key
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

// control is work the goroutine does with the connection, between
// batches.
type control struct {
	kind  controlKind
	ctx   context.Context
	fn    func(*pgx.Conn) // controlFunc
	reply chan controlReply
}

type controlKind int

const (
	controlShutdown controlKind = iota // release everything, close
	controlRetire                      // stop and close: an idle spare, holding nothing
	controlFunc                        // run fn with the connection (Clear, tests)
	controlLend                        // give the socket to the caller until it gives it back (a wait)
)

type controlReply struct {
	err error
	// controlLend: the connection had failed before it could be lent (a
	// spare gone stale); the socket was not lent.
	stale bool
}

// start starts the connection's goroutine.
func (s *Conn) start() {
	s.w = newWire(s)
	s.reqs = make(chan *request, maxBatch)
	s.ctl = make(chan *control)
	s.free = make(chan struct{}, 1)
	s.kill = make(chan struct{})
	s.dead = make(chan struct{})
	s.exited = make(chan struct{})
	s.epoch = time.Now()
	s.lastOK.Store(int64(s.since()))
	go s.run()
}

func (s *Conn) since() time.Duration { return time.Since(s.epoch) }

// PID is the backend's process id.
func (s *Conn) PID() int32 { return s.pid }

// Done is closed when the connection has ended, lost or closed, and its
// goroutine is gone: every lock on it is gone. Cause says why.
func (s *Conn) Done() <-chan struct{} { return s.exited }

// Cause is why the connection ended, once Done is closed.
func (s *Conn) Cause() error { return s.cause }

// Pending is the number of requests queued or on the wire.
func (s *Conn) Pending() int32 { return s.pending.Load() }

// Claim counts in a request the caller is about to send with DoClaimed
// (so that the next caller sees the connection busy), or gives up with
// Unclaim.
func (s *Conn) Claim()   { s.pending.Add(1) }
func (s *Conn) Unclaim() { s.pending.Add(-1) }

// Dirty reports whether an unlock found the backend holding less than it
// should: Clear it before it is used for other locks.
func (s *Conn) Dirty() bool { return s.dirty.Load() }

// Fast reports whether the connection calls the lock functions by the
// fast-path protocol.
func (s *Conn) Fast() bool { return s.fast != nil }

// Expired reports whether the session went longer than PingInterval +
// PingTimeout without an answer: its locks must be treated as lost even if
// the goroutine that would notice has not run (a paused process).
func (s *Conn) Expired() bool {
	return s.since()-time.Duration(s.lastOK.Load()) > s.cfg.giveUp()
}

func (s *Conn) Alive() bool {
	select {
	case <-s.dead:
		return false
	default:
		return !s.Expired()
	}
}

func (s *Conn) LostErr() error {
	return fmt.Errorf("%w: session (backend pid %d) unanswered for more than PingInterval + PingTimeout (%s)", ErrLockLost, s.pid, s.cfg.giveUp())
}

// Do runs one operation on the session and waits for its result. The
// caller must know whether a lock was taken, so there is no context: the
// wait is bounded by PingTimeout, after which the session is lost.
func (s *Conn) Do(op Op, id Key) (bool, error) {
	s.pending.Add(1)
	return s.DoClaimed(op, id)
}

// DoClaimed is do for a caller that counted its request in s.pending
// already (reserveSession does, so that the next caller sees the session
// busy and picks another).
func (s *Conn) DoClaimed(op Op, id Key) (bool, error) {
	defer s.pending.Add(-1)
	r := &request{op: op, id: id, result: make(chan result, 1)}
	if s.pending.Load() == 1 && s.take() {
		// Only function calls go direct (take), and a call is never
		// skipped for an earlier one's failure: no retry.
		s.direct(r)
		s.give()
		res := <-r.result
		return res.ok, res.err
	}
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

// take takes the socket if the goroutine lent it and nobody uses it.
func (s *Conn) take() bool {
	if s.fast == nil {
		return false
	}
	select {
	case <-s.free:
		return true
	default:
		return false
	}
}

// give gives the socket back, to the goroutine if it waits for it. The
// taker must not wait for the goroutine before it gives.
func (s *Conn) give() { s.free <- struct{}{} }

// direct sends r alone and reads its answer, on the caller's goroutine,
// which holds the socket (take); r is answered. A failure ends the
// session as it would on the goroutine: Abort closes the socket and the
// goroutine finishes with the cause.
func (s *Conn) direct(r *request) {
	select {
	case <-s.dead:
		r.result <- result{err: s.cause}
		return
	default:
	}
	one := []*request{r}
	b, err := s.send(one)
	if err == nil {
		err = s.receive(b)
	}
	if err != nil {
		s.Abort(err)
	}
}

// Abort ends the session from outside its goroutine (a caller that found
// it expired, a Close that ran out of time): the socket is closed, which
// ends whatever I/O the goroutine is in.
func (s *Conn) Abort(cause error) {
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
func (s *Conn) run() {
	cfg := s.cfg
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
		lent     bool       // the token is in free (or with a caller)
		armed    bool       // watchT runs
	)
	// reclaim takes the socket back from callers, waiting for one that
	// uses it: at most a round trip, or a wait (which has the session to
	// itself); Abort closes the socket, which ends either at once.
	reclaim := func() {
		if lent {
			<-s.free
			lent = false
		}
	}
	// tryReclaim takes the socket back unless a caller uses it.
	tryReclaim := func() bool {
		if lent {
			select {
			case <-s.free:
				lent = false
			default:
				return false
			}
		}
		return true
	}
	for {
		if pending != nil && len(inflight) == 0 && pending.kind == controlLend && len(queue) == 0 && !s.Expired() {
			// The caller has the socket now; it gives the token back
			// to free when its wait is over, as if the socket had been
			// lent while idle, and can use it again at once.
			pending.reply <- controlReply{}
			pending, lent = nil, true
			continue
		}
		if pending != nil && len(inflight) == 0 {
			var over bool
			if queue, over = s.control(pending, queue); over {
				return
			}
			pending = nil
			continue
		}
		if pending == nil && len(queue) == 0 && len(inflight) == 0 && !lent {
			queue = s.linger(queue)
		}
		if pending == nil && len(queue) == 0 && len(inflight) == 0 {
			if watchable && watch == nil && !armed {
				watchT.Reset(idleWatchAfter)
				armed = true
			}
			if s.fast != nil && watch == nil && !lent {
				s.give()
				lent = true
			}
			var readable <-chan struct{}
			if watch != nil {
				readable = watch.readable
			}
			select {
			case <-watchT.C:
				// Callers that used the lent socket since count as
				// activity; one using it now keeps it a while more.
				armed = false
				if idle := s.since() - time.Duration(s.lastOK.Load()); idle < idleWatchAfter {
					watchT.Reset(idleWatchAfter - idle)
					armed = true
					continue
				}
				if !tryReclaim() {
					watchT.Reset(idleWatchRetry)
					armed = true
					continue
				}
				watch = startIdleWatch(s.w.nc)
				continue
			case <-readable:
				// The server sent something unasked: it is ending the
				// session, most likely. A ping reads it now.
				<-watch.done
				watch = nil
				cfg.Logger.Debug("advisory: the server sent to an idle session; pinging now", "pid", s.pid)
				queue = append(queue, &request{op: Ping, result: make(chan result, 1)})
				continue
			case r := <-s.reqs:
				reclaim()
				queue = append(queue, r)
			case <-ping.C:
				idle := s.since() - time.Duration(s.lastOK.Load())
				if idle < cfg.PingInterval {
					ping.Reset(cfg.PingInterval - idle)
					continue
				}
				if !tryReclaim() {
					// A caller has the socket: its answer, or the grant
					// of its wait, says more than a ping.
					ping.Reset(idleWatchRetry)
					continue
				}
				queue = append(queue, &request{op: Ping, result: make(chan result, 1)})
				ping.Reset(cfg.PingInterval)
			case c := <-s.ctl:
				reclaim()
				pending = c
			case <-s.kill:
				reclaim()
				if watch != nil {
					watch.stop() // before finish: nothing outlives the session
					watch = nil
				}
				s.finish(s.killErr, queue, inflight)
				return
			}
			// Busy again: the socket is the goroutine's alone.
			watchT.Stop()
			armed = false
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
				s.cfg.Stats.Pipelined.Add(1)
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

// idleWatchRetry is how soon the goroutine looks again when it would
// watch the idle socket or ping, and a caller has the socket (a wait,
// most likely): once the wait is granted and the lock held, the watch
// starts within about this long.
const idleWatchRetry = 10 * time.Millisecond

// linger yields the processor a few times before the goroutine blocks
// for work: the callers just answered run first, and the next request of
// a caller that locks and unlocks in a row is then taken without the
// goroutine being parked and woken again (a futex wake-up and a context
// switch each time: with one goroutine looping TryLock+Unlock, perf stat
// counted about a fifth fewer context switches above raw pgx's).
func (s *Conn) linger(queue []*request) []*request {
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
func (s *Conn) takeQueued(queue []*request) []*request {
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
func (s *Conn) send(reqs []*request) (*batch, error) {
	if s.Expired() {
		// The process did not run for longer than the server is guaranteed
		// to keep a silent session (paused, or starved). Whether or not the
		// server kept it, the locks may have been reported lost already:
		// they must stay lost.
		return nil, s.withBatch(reqs, s.LostErr())
	}
	b := &batch{reqs: reqs, sent: s.since(), deadline: time.Now().Add(s.cfg.PingTimeout)}
	s.cfg.Stats.Batches.Add(1)
	s.cfg.Stats.Requests.Add(int64(len(reqs)))
	if err := s.w.write(s.w.encode(reqs), s.cfg.PingTimeout); err != nil {
		return nil, s.withBatch(reqs, s.failure(err))
	}
	return b, nil
}

// withBatch answers reqs with err and returns it.
func (s *Conn) withBatch(reqs []*request, err error) error {
	s.cfg.PingsFailed(countPings(reqs))
	for _, r := range reqs {
		r.result <- result{err: err}
	}
	return err
}

// failure is the cause of a session that failed on I/O: what Abort said,
// if it was aborted.
func (s *Conn) failure(err error) error {
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
func (s *Conn) receive(b *batch) error {
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
		lost = fmt.Errorf("%w: %w", ErrLockLost, MapError("session statement", out.pgErr))
	}
	if lost != nil {
		return s.withBatch(b.reqs, lost)
	}
	s.lastOK.Store(int64(b.sent))
	s.rtt.Store(int64(s.since() - b.sent))
	for i, r := range b.reqs {
		pgErr, retry := out.answer(i)
		switch {
		case retry:
			r.result <- result{retry: true}
		case pgErr != nil:
			r.result <- result{err: MapError("advisory lock", pgErr)}
		default:
			if !out.ok[i] && (r.op == Unlock || r.op == UnlockShared) {
				s.dirty.Store(true)
			}
			r.result <- result{ok: out.ok[i]}
		}
	}
	return nil
}

// failQueue answers requests that were not sent with err.
func (s *Conn) failQueue(queue []*request, err error) {
	for _, r := range queue {
		r.result <- result{err: err}
	}
}

// drainWire reads every batch on the wire and answers its requests with
// cause: their outcome does not matter any more, as the backend is
// cleared next. It reports whether the connection is still usable.
func (s *Conn) drainWire(inflight []*batch, cause error) bool {
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
func (s *Conn) leavePooler(cause error, queue []*request, inflight []*batch) {
	s.failQueue(queue, cause)
	if s.drainWire(inflight, cause) {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.PingTimeout)
		if err := s.releaseAll(ctx); err != nil {
			s.cfg.Logger.Error("advisory: locks left behind a transaction pooler", "pid", s.pid, "error", err)
		}
		cancel()
	}
	s.finish(cause, nil, nil)
}

// control runs c with nothing on the wire; it reports whether the session
// is over. queue holds requests not sent yet (a shutdown answers them); a
// wait may put one in front of them.
func (s *Conn) control(c *control, queue []*request) ([]*request, bool) {
	if s.Expired() && c.kind != controlShutdown {
		s.finish(s.LostErr(), queue, nil)
		c.reply <- controlReply{err: s.LostErr(), stale: true}
		return nil, true
	}
	switch c.kind {
	case controlLend:
		// With requests queued (run lends at once otherwise), the
		// caller has the socket until it gives it back, and they wait.
		c.reply <- controlReply{}
		<-s.free
		return queue, false
	case controlFunc:
		c.fn(s.conn)
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
		ctx, cancel := context.WithTimeout(c.ctx, s.cfg.PingTimeout)
		var err error
		if e := s.releaseAll(ctx); e != nil {
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
func (s *Conn) dropControl(c *control) {
	if c == nil {
		return
	}
	c.reply <- controlReply{err: s.cause, stale: true}
}

// finish ends the session: every request taken is answered with cause,
// the connection is closed, and Done is closed: the Locker cancels the
// locks on it.
func (s *Conn) finish(cause error, queue []*request, inflight []*batch) {
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
	close(s.exited)
}

// sendControl sends c to the goroutine and waits for its reply; false if the
// session ended first.
func (s *Conn) sendControl(c *control) (controlReply, bool) {
	c.reply = make(chan controlReply, 1)
	select {
	case s.ctl <- c:
	case <-s.dead:
		return controlReply{}, false
	}
	return <-c.reply, true
}

// Shutdown stops the session for Close: what is on the wire is answered,
// then every lock is released explicitly before the connection closes,
// so that nothing is left in pg_locks when Close returns. ctx bounds it.
func (s *Conn) Shutdown(ctx context.Context) error {
	c := &control{kind: controlShutdown, ctx: ctx, reply: make(chan controlReply, 1)}
	select {
	case s.ctl <- c:
	case <-s.dead:
		<-s.exited
		return nil // lost already: the socket is closed
	case <-ctx.Done():
		s.Abort(fmt.Errorf("%w: %w", ErrLockLost, pgbaton.ErrClosed))
		<-s.exited
		return fmt.Errorf("advisory: close session (backend pid %d): %w", s.pid, context.Cause(ctx))
	}
	select {
	case rep := <-c.reply:
		<-s.exited
		return rep.err
	case <-ctx.Done():
		s.Abort(fmt.Errorf("%w: %w", ErrLockLost, pgbaton.ErrClosed))
		<-s.exited
		return fmt.Errorf("advisory: close session (backend pid %d): %w", s.pid, context.Cause(ctx))
	}
}

// Retire stops an idle session that holds nothing and closes its
// connection.
func (s *Conn) Retire() {
	s.sendControl(&control{kind: controlRetire, ctx: context.Background()})
	<-s.exited
}

// WithConn runs fn with the connection to itself, between batches.
func (s *Conn) WithConn(fn func(*pgx.Conn)) {
	s.sendControl(&control{kind: controlFunc, fn: fn, ctx: context.Background()})
}

// Clear releases every advisory lock the backend holds, between batches,
// if an unlock found it holding less than it should (Dirty). If that
// fails the connection ends, and the error says why.
func (s *Conn) Clear() error {
	if !s.dirty.Load() {
		return nil
	}
	var err error
	s.WithConn(func(*pgx.Conn) {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.PingTimeout)
		err = s.releaseAll(ctx)
		cancel()
	})
	if err != nil {
		s.Abort(fmt.Errorf("%w: %w", ErrLockLost, err))
		return err
	}
	s.dirty.Store(false)
	return nil
}

// countPings counts the pings in batch: a lost batch's pings are the
// session's renew failures.
func countPings(batch []*request) int {
	n := 0
	for _, r := range batch {
		if r.op == Ping {
			n++
		}
	}
	return n
}

// releaseAll releases every advisory lock of the backend. The statement
// is guarded by the token, so behind a transaction pooler, where it may
// land on any backend, it is repeated a few times until it reaches the
// right one; elsewhere the first attempt does it.
func (s *Conn) releaseAll(ctx context.Context) error {
	for range 20 {
		n, err := db.New().AdvisoryUnlockAll(ctx, simpleProtocol{s.conn}, s.token)
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
	return fmt.Errorf("%w: could not reach backend %d again to release its locks; they stay until the pooler closes that server connection", ErrSessionPooling, s.pid)
}

// runWait blocks in pg_advisory_lock on the session's connection, on the
// caller's goroutine, which holds the socket. It reports whether the
// session goes on: only when the lock was granted to a caller still
// waiting for it.
//
// The statement runs under its own context: cancelling it through pgx
// would close the connection, and the server would release a lock granted
// in the meantime only when it notices, some time later. Instead, when the
// caller gives up (ctx) or the Locker closes (stop), a cancel request
// stops the wait on the server and the backend is cleared before the
// session ends.
func (s *Conn) runWait(ctx, stop context.Context, id Key, shared bool) (_ WaitResult, goOn bool) {
	pingTimeout := s.cfg.PingTimeout
	wctx, wcancel := context.WithCancelCause(ctx)
	defer wcancel(nil)
	stopClose := context.AfterFunc(stop, func() { wcancel(pgbaton.ErrClosed) })
	defer stopClose()
	qctx, qcancel := context.WithCancel(context.Background())
	defer qcancel()
	cancelled := make(chan struct{})
	var kill *time.Timer // written before cancelled is closed
	stopWait := context.AfterFunc(wctx, func() {
		defer close(cancelled)
		cctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
		defer cancel()
		_ = s.conn.PgConn().CancelRequest(cctx)
		// If the statement is still running when the cancel should have
		// landed, the server is unreachable: drop the connection.
		kill = time.AfterFunc(pingTimeout, qcancel)
	})
	waited, err := s.blockingLock(qctx, id, shared)
	if !stopWait() {
		// Given up. Postgres may have granted the lock just as the cancel
		// arrived (err == nil), so clear the backend either way.
		<-cancelled
		kill.Stop()
		s.clearBackend()
		return WaitResult{Err: context.Cause(wctx), Waited: waited || err != nil}, false
	}
	if err != nil {
		// A connection that failed (or that the server ended: FATAL)
		// took nothing with it: another one can wait instead.
		return WaitResult{Err: MapError("wait for lock", err), Stale: s.conn.IsClosed()}, false
	}
	s.lastOK.Store(int64(s.since()))
	return WaitResult{Waited: waited}, true
}

// blockingLock takes the lock, waiting as long as it takes; waited says
// whether the key was held when the wait began.
func (s *Conn) blockingLock(ctx context.Context, id Key, shared bool) (waited bool, err error) {
	if s.fast != nil {
		return s.fastWait(ctx, id, shared)
	}
	q := db.New()
	switch {
	case id.Pair && shared:
		waited, err = q.AdvisoryLockPairShared(ctx, s.conn, db.AdvisoryLockPairSharedParams{Hi: id.Hi, Lo: id.Lo, Token: s.token})
	case id.Pair:
		waited, err = q.AdvisoryLockPair(ctx, s.conn, db.AdvisoryLockPairParams{Hi: id.Hi, Lo: id.Lo, Token: s.token})
	case shared:
		waited, err = q.AdvisoryLockShared(ctx, s.conn, db.AdvisoryLockSharedParams{Key: id.ID, Token: s.token})
	default:
		waited, err = q.AdvisoryLock(ctx, s.conn, db.AdvisoryLockParams{Key: id.ID, Token: s.token})
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("%w (wait ran on another backend than %d)", ErrSessionPooling, s.pid)
	}
	return waited, err
}

// clearBackend releases whatever advisory locks the session's backend
// holds, before the session ends. If the connection is broken, the server
// releases them when it notices the client has gone.
func (s *Conn) clearBackend() {
	if s.conn.IsClosed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.PingTimeout)
	err := s.releaseAll(ctx)
	cancel()
	if err != nil {
		s.cfg.Logger.Warn("advisory: clearing an abandoned wait failed; the server releases its locks when it notices the closed connection", "error", err)
	}
}

// waitedAfter is how long a grant by fastWait may take and still count
// as granted at once, the key free: twice the session's last round trip,
// plus a millisecond for the scheduler of a busy machine. A grant that
// took longer waited for a holder, or for a server or network so slow
// that the difference does not matter: waited only feeds Stats.Contended
// and the held/failed split of a wait that failed.
func (s *Conn) waitedAfter() time.Duration {
	return 2*time.Duration(s.rtt.Load()) + time.Millisecond
}

// WaitResult is how a Wait ended.
type WaitResult struct {
	Waited bool  // the key was held when the wait began
	Stale  bool  // the connection had failed before the wait could run: wait on another
	Err    error // not granted
}

// Wait blocks until k is granted on the connection, or until ctx or stop
// (the Locker's context: its end means closed) ends. The wait runs on the
// caller's goroutine, with the socket taken from the session's goroutine
// (lent, or borrowed between batches), so the grant reaches the caller
// with no hand-off. Only a granted wait leaves the connection going on,
// holding k; given up or failed, it ends, its backend cleared, before
// Wait returns. ok is false if the connection had ended before (Cause).
func (s *Conn) Wait(ctx, stop context.Context, k Key, shared bool) (_ WaitResult, ok bool) {
	if !s.take() {
		rep, ok := s.sendControl(&control{kind: controlLend, ctx: ctx})
		switch {
		case !ok:
			return WaitResult{}, false
		case rep.stale:
			<-s.exited
			return WaitResult{Err: rep.err, Stale: true}, true
		}
	}
	select {
	case <-s.dead:
		s.give()
		return WaitResult{}, false
	default:
	}
	if s.Expired() {
		// As at a send: the locks of a session that went silent for that
		// long may have been reported lost already.
		err := s.LostErr()
		s.Abort(err)
		s.give()
		<-s.exited
		return WaitResult{Err: err, Stale: true}, true
	}
	rep, goOn := s.runWait(ctx, stop, k, shared)
	if !goOn {
		s.Abort(fmt.Errorf("%w: %w", ErrLockLost, pgbaton.ErrClosed))
	}
	s.give()
	if !goOn {
		<-s.exited
	}
	return rep, true
}
