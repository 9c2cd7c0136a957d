package advisory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton"
)

// Locker takes session advisory locks on connections it owns. It is safe
// for concurrent use. Create it with New and release everything with Close.
type Locker struct {
	pool  *pgxpool.Pool
	cfg   Config
	epoch time.Time // monotonic base of session timestamps

	ctx    context.Context // cancelled by Close: ends blocking waits
	cancel context.CancelFunc

	opening chan struct{} // one session opens at a time

	mu       sync.Mutex
	closed   bool
	sessions []*session
	entries  map[lockID]*entry
	total    int                 // locks held or being taken: the MaxLocks budget
	names    map[string]struct{} // names recorded in the registry
	bg       sync.WaitGroup      // blocking waits and retiring sessions
	spares   []spareConn         // idle connections kept for waits
	spreadAt time.Duration       // l.since() before which no session opens to spread load

	stats   counters
	metrics metrics
	reopen  atomic.Bool // a session was lost: log when the next one opens
}

// entry is the in-process state of one key. Postgres advisory locks are
// re-entrant per session, so this bookkeeping, not the server, keeps two
// goroutines of one Locker from both holding a key.
type entry struct {
	shared  bool
	sess    *session
	locks   map[*Lock]struct{}
	busy    bool          // a take or release of the key is under way
	waiting bool          // ... and it is a blocking wait
	changed chan struct{} // made by the first waiter, closed by notify
}

// notify wakes the goroutines waiting for the entry to change; called
// with l.mu held.
func (e *entry) notify() {
	if e.changed != nil {
		close(e.changed)
		e.changed = nil
	}
}

// wait returns a channel closed at the next notify; called with l.mu
// held.
func (e *entry) wait() <-chan struct{} {
	if e.changed == nil {
		e.changed = make(chan struct{})
	}
	return e.changed
}

// New returns a Locker that takes its connections from pool. It does no
// I/O: sessions open on first use. pool must connect to the primary
// directly or through a session-mode pooler (see ErrSessionPooling).
// Connections taken for sessions, and for each blocked Lock or RLock call,
// are acquired from the pool and leave it for good (Hijack): the pool's
// MaxConnLifetime and health checks never close them, and they stop
// counting against its MaxConns. Keep the server's max_connections in
// mind: a Locker uses up to MaxSessionsUnderLoad connections, one per
// MaxLocksPerSession locks beyond that, plus one per waiting call.
func New(pool *pgxpool.Pool, cfg Config) (*Locker, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: advisory.New: nil pool", pgbaton.ErrInvalidArgument)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Locker{
		pool:    pool,
		cfg:     cfg,
		epoch:   time.Now(),
		ctx:     ctx,
		cancel:  cancel,
		opening: make(chan struct{}, 1),
		entries: make(map[lockID]*entry),
		names:   make(map[string]struct{}),
		metrics: newMetrics(cfg),
	}
	return l, nil
}

func (l *Locker) since() time.Duration { return time.Since(l.epoch) }

// TryLock takes the exclusive lock on key if it is free, without waiting.
// It returns ErrLocked when another session or another goroutine of this
// Locker holds it.
func (l *Locker) TryLock(ctx context.Context, key Key) (*Lock, error) {
	return l.acquire(ctx, key, false, false)
}

// Lock takes the exclusive lock on key, waiting until it is free or ctx
// ends. The wait runs on a connection of its own, so it never holds up the
// locks shared on a session; when ctx ends the wait is cancelled and no
// lock is left behind, even if Postgres granted it just then. If the
// waiting connection fails, Lock returns the error rather than retrying
// (Campaign retries).
func (l *Locker) Lock(ctx context.Context, key Key) (*Lock, error) {
	return l.acquire(ctx, key, false, true)
}

// TryRLock takes key in shared mode if no one holds it exclusively,
// without waiting. Any number of shared holders may hold a key at once.
func (l *Locker) TryRLock(ctx context.Context, key Key) (*Lock, error) {
	return l.acquire(ctx, key, true, false)
}

// RLock takes key in shared mode, waiting until no one holds it
// exclusively or ctx ends.
func (l *Locker) RLock(ctx context.Context, key Key) (*Lock, error) {
	return l.acquire(ctx, key, true, true)
}

func (l *Locker) acquire(ctx context.Context, key Key, shared, wait bool) (*Lock, error) {
	at := attempt{start: l.metrics.start()}
	lk, err := l.acquireKey(ctx, key, shared, wait, &at)
	if !at.recorded {
		l.metrics.attempt(key, at.start, err, at.contended)
	}
	if err != nil {
		l.logRefusal("lock "+key.String(), err)
	}
	return lk, err
}

// attempt is what acquire's metrics need to know about one call.
type attempt struct {
	start     time.Time
	contended bool // the key was found held
	recorded  bool // acquireKey recorded the attempt itself
}

// acquireKey is acquire without the metrics.
func (l *Locker) acquireKey(ctx context.Context, key Key, shared, wait bool, at *attempt) (*Lock, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", pgbaton.ErrInvalidArgument)
	}
	id, err := key.resolve(l.cfg.Namespace)
	if err != nil {
		return nil, err
	}
	if key.kind == kindName {
		if err := l.register(ctx, key.name, id.id); err != nil {
			return nil, err
		}
	}
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, fmt.Errorf("advisory: lock %s: %w", key, pgbaton.ErrClosed)
		}
		e := l.entries[id]
		if e != nil {
			// Another goroutine of this Locker holds or is taking the key.
			if !e.busy && shared && e.shared && e.sess.alive() {
				lk := l.newLock(key, id, true, e.sess)
				e.locks[lk] = struct{}{}
				l.mu.Unlock()
				return lk, nil
			}
			if !wait && (!e.busy || e.waiting) {
				l.mu.Unlock()
				l.stats.contended.Add(1)
				return nil, fmt.Errorf("%w: %s is held in this process", ErrLocked, key)
			}
			at.contended = true
			ch := e.wait()
			l.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("advisory: lock %s: %w", key, context.Cause(ctx))
			case <-l.ctx.Done():
				return nil, fmt.Errorf("advisory: lock %s: %w", key, pgbaton.ErrClosed)
			}
		}
		if l.total >= l.cfg.MaxLocks {
			l.mu.Unlock()
			return nil, fmt.Errorf("%w: this Locker holds Config.MaxLocks = %d locks already", ErrLockTableFull, l.cfg.MaxLocks)
		}
		e = &entry{shared: shared, busy: true, locks: make(map[*Lock]struct{}, 1)}
		l.entries[id] = e
		l.total++
		l.mu.Unlock()

		s, err := l.take(ctx, key, id, shared, wait, e, &at.contended)

		l.mu.Lock()
		e.busy, e.waiting = false, false
		e.notify()
		if err == nil && l.closed {
			err = fmt.Errorf("advisory: lock %s: %w", key, pgbaton.ErrClosed)
		}
		if err == nil {
			select {
			case <-s.done: // lost since: its locks went with it
				err = fmt.Errorf("advisory: lock %s: %w", key, s.cause)
			default:
			}
		}
		if err != nil {
			delete(l.entries, id)
			l.total--
			if s != nil {
				s.count--
			}
			l.mu.Unlock()
			return nil, err
		}
		lk := l.newLock(key, id, shared, s)
		e.sess = s
		e.locks[lk] = struct{}{}
		l.mu.Unlock()
		if ctx.Err() != nil {
			// Taken, but the caller gave up meanwhile: do not hand out a
			// lock nobody will unlock. The metrics count it as acquired,
			// and the Unlock below ends its hold, so pgbaton.held stays
			// balanced.
			l.metrics.attempt(key, at.start, nil, false)
			at.recorded = true
			_ = lk.Unlock(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("advisory: lock %s: %w", key, context.Cause(ctx))
		}
		return lk, nil
	}
}

// take gets the lock from the server: first with a try on a shared
// session, then, for a waiting call, with a blocking wait on a connection
// of its own that becomes a session once the lock is granted. On success
// the returned session's count includes the lock.
func (l *Locker) take(ctx context.Context, key Key, id lockID, shared, wait bool, e *entry, contended *bool) (*session, error) {
	s, err := l.reserveSession(ctx)
	if err != nil {
		return nil, err
	}
	op := opTry
	if shared {
		op = opTryShared
	}
	ok, err := s.doClaimed(ctx, op, id)
	if err == nil && ok {
		return s, nil
	}
	l.unreserve(s)
	if err != nil {
		return nil, fmt.Errorf("advisory: lock %s: %w", key, err)
	}
	l.stats.contended.Add(1)
	*contended = true
	if !wait {
		return nil, fmt.Errorf("%w: %s", ErrLocked, key)
	}
	l.mu.Lock()
	e.waiting = true
	e.notify() // try-lockers waiting on the outcome can give up now
	l.mu.Unlock()
	s, err = l.wait(ctx, id, shared)
	if err != nil {
		return nil, fmt.Errorf("advisory: lock %s: %w", key, err)
	}
	return s, nil
}

// reserveSession returns a live session with room for one more lock and
// counts that lock in, opening a session if none has room. It also counts
// in the request the caller is about to send (s.pending): the caller must
// send it with doClaimed.
func (l *Locker) reserveSession(ctx context.Context) (*session, error) {
	take := func() (*session, error) {
		if l.closed {
			return nil, pgbaton.ErrClosed
		}
		if s := l.roomySession(); s != nil {
			s.count++
			s.pending.Add(1)
			return s, nil
		}
		return nil, nil
	}
	l.mu.Lock()
	s, err := take()
	l.mu.Unlock()
	if s != nil || err != nil {
		return s, err
	}
	select {
	case l.opening <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	defer func() { <-l.opening }()
	l.mu.Lock()
	s, err = take() // opened by someone else meanwhile?
	l.mu.Unlock()
	if s != nil || err != nil {
		return s, err
	}
	conn, pid, err := l.openConn(ctx)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		closeConn(conn)
		return nil, pgbaton.ErrClosed
	}
	s = l.newSession(conn, pid)
	s.shared = true
	s.count++
	s.pending.Add(1)
	l.sessions = append(l.sessions, s)
	return s, nil
}

// roomySession returns a live session with room, preferring the first
// whose pipeline is not deep: requests on one session are pipelined, so a
// busy session sends a new request at once, but its backend runs them one
// after another, and past spreadDepth requests queued or on the wire a
// second backend (another core on the server) does more. When every
// session with room is that busy and there are fewer than
// MaxSessionsUnderLoad of them, one more opens in the background; the
// request meanwhile goes to the least busy one. Must be called with l.mu
// held.
func (l *Locker) roomySession() *session {
	if l.closed {
		return nil
	}
	var busy *session
	roomy := 0
	for _, s := range l.sessions {
		if s.count < l.cfg.MaxLocksPerSession && s.alive() {
			if s.pending.Load() < spreadDepth {
				return s
			}
			roomy++
			if busy == nil || s.pending.Load() < busy.pending.Load() {
				busy = s
			}
		}
	}
	if busy != nil && roomy < l.cfg.MaxSessionsUnderLoad {
		l.spreadLocked()
	}
	return busy
}

// spreadDepth is how many requests queued or on the wire make a session
// busy enough to spread new ones to another. Measured on 2 cores with 8
// goroutines looping TryLock+Unlock: one pipelined session did 1.30–1.34×
// eight raw pgx connections, two sessions 1.09–1.22× (smaller batches, two
// backends contending with the client for the cores).
const spreadDepth = 16

// spreadLocked opens one more shared session in the background, unless
// a session is opening already or the last such attempt failed less than
// RetryDelay ago. Must be called with l.mu held.
func (l *Locker) spreadLocked() {
	if l.closed || l.since() < l.spreadAt {
		return
	}
	select {
	case l.opening <- struct{}{}:
	default:
		return
	}
	l.bg.Add(1)
	go func() {
		defer l.bg.Done()
		defer func() { <-l.opening }()
		conn, pid, err := l.spareOrConn(l.ctx)
		l.mu.Lock()
		if err != nil {
			l.spreadAt = l.since() + l.cfg.RetryDelay
			l.mu.Unlock()
			if l.ctx.Err() == nil {
				l.cfg.Logger.Warn("advisory: could not open a session to spread load", "err", err)
			}
			return
		}
		if l.closed {
			l.mu.Unlock()
			closeConn(conn)
			return
		}
		s := l.newSession(conn, pid)
		s.shared = true
		l.sessions = append(l.sessions, s)
		l.mu.Unlock()
	}()
}

// spareOrConn returns a kept spare connection that still answers, or a
// new one.
func (l *Locker) spareOrConn(ctx context.Context) (*pgx.Conn, int32, error) {
	for {
		sp, ok := l.takeSpare()
		if !ok {
			return l.openConn(ctx)
		}
		pctx, cancel := context.WithTimeout(ctx, l.cfg.PingTimeout)
		err := sp.conn.Ping(pctx)
		cancel()
		if err == nil {
			err = l.readyConn(ctx, sp.conn)
		}
		if err == nil {
			return sp.conn, sp.pid, nil
		}
		closeConn(sp.conn)
	}
}

// unreserve gives back a lock counted in by reserveSession or held on s.
func (l *Locker) unreserve(s *session) {
	l.mu.Lock()
	s.count--
	retire := l.retireLocked(s)
	l.mu.Unlock()
	if retire {
		go func() {
			defer l.bg.Done()
			if conn := s.park(); conn != nil {
				l.addSpare(conn, s.pid)
			}
		}()
	}
}

// maxSpares bounds the idle connections kept for blocking waits.
const maxSpares = 2

type spareConn struct {
	conn *pgx.Conn
	pid  int32
}

// addSpare keeps conn, set up and holding no locks, for a later wait.
func (l *Locker) addSpare(conn *pgx.Conn, pid int32) {
	l.mu.Lock()
	if l.closed || len(l.spares) >= maxSpares {
		l.mu.Unlock()
		closeConn(conn)
		return
	}
	l.spares = append(l.spares, spareConn{conn, pid})
	l.mu.Unlock()
}

// takeSpare returns a kept connection, or ok false.
func (l *Locker) takeSpare() (spareConn, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.spares) == 0 {
		return spareConn{}, false
	}
	sp := l.spares[len(l.spares)-1]
	l.spares = l.spares[:len(l.spares)-1]
	return sp, true
}

// retireLocked decides, with l.mu held, whether an idle session should be
// closed. A session made from a granted wait goes as soon as another
// session has room; shared sessions are kept up to MaxSessionsUnderLoad
// with room, so that load spread over them does not open and close a
// session at every lull. When it returns true the caller must shut s down
// and call l.bg.Done.
func (l *Locker) retireLocked(s *session) bool {
	if s.count > 0 || l.closed {
		return false
	}
	keep := 1
	if s.shared {
		keep = l.cfg.MaxSessionsUnderLoad
	}
	others := 0
	for _, o := range l.sessions {
		if o != s && o.alive() && o.count < l.cfg.MaxLocksPerSession {
			others++
		}
	}
	if others < keep {
		return false
	}
	l.removeSession(s)
	l.bg.Add(1)
	return true
}

// removeSession must be called with l.mu held.
func (l *Locker) removeSession(s *session) {
	for i, x := range l.sessions {
		if x == s {
			l.sessions = append(l.sessions[:i:i], l.sessions[i+1:]...)
			return
		}
	}
}

// sessionEnded runs once when s is lost or closed: every lock on it is
// cancelled with the cause, and its keys are free to be taken again (on
// another session).
func (l *Locker) sessionEnded(s *session, cause error) (lost int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.removeSession(s)
	if !errors.Is(cause, pgbaton.ErrClosed) {
		l.stats.lostSessions.Add(1)
		l.reopen.Store(true)
	}
	metricCause := lossCause(cause)
	if !errors.Is(cause, ErrLockLost) {
		cause = fmt.Errorf("%w: %w", ErrLockLost, cause)
	}
	for id, e := range l.entries {
		if e.sess != s || e.busy {
			continue // a busy entry is cleaned up by the goroutine that made it busy
		}
		for lk := range e.locks {
			l.metrics.ended(lk, metricCause) // before Done: watchers see it recorded
			lk.cancel(cause)
			lost++
		}
		delete(l.entries, id)
		l.total--
		e.notify()
	}
	return lost
}

// Close releases every lock the Locker holds (their contexts are
// cancelled with ErrLockLost and pgbaton.ErrClosed), cancels blocking
// waits, and closes its sessions. Locks are released explicitly before
// the connections close, so they are gone from pg_locks when Close
// returns nil. ctx bounds the wait for that; Close is idempotent.
func (l *Locker) Close(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", pgbaton.ErrInvalidArgument)
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	sessions := l.sessions
	l.sessions = nil
	cause := fmt.Errorf("%w: %w", ErrLockLost, pgbaton.ErrClosed)
	for id, e := range l.entries {
		if e.busy {
			continue
		}
		for lk := range e.locks {
			l.metrics.ended(lk, CauseClosed)
			lk.cancel(cause)
		}
		delete(l.entries, id)
		l.total--
		e.notify()
	}
	l.mu.Unlock()
	l.cancel()
	var errs []error
	for _, s := range sessions {
		errs = append(errs, s.shutdown(ctx))
	}
	l.bg.Wait()
	l.mu.Lock()
	spares := l.spares
	l.spares = nil
	l.mu.Unlock()
	for _, sp := range spares {
		closeConn(sp.conn)
	}
	return errors.Join(errs...)
}
