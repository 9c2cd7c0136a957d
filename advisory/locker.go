package advisory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory/internal/pgsession"
	"github.com/pgbaton/pgbaton/internal/appname"
	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// Locker takes session advisory locks on connections it owns. It is safe
// for concurrent use. Create it with New and release everything with Close.
type Locker struct {
	pool  *pgxpool.Pool
	cfg   Config
	conn  pgsession.Config // what its connections need of cfg
	epoch time.Time        // monotonic base of spreadAt

	ctx    context.Context // cancelled by Close: ends blocking waits
	cancel context.CancelFunc

	opening chan struct{} // one session opens at a time

	mu       sync.Mutex
	closed   bool
	sessions []*session
	entries  map[lockID]*entry
	total    int                 // locks held or being taken: the MaxLocks budget
	names    map[string]struct{} // names recorded in the registry
	bg       sync.WaitGroup      // blocking waits and sessions being parked
	spares   []*session          // idle sessions kept for waits (not in sessions)
	spreadAt time.Duration       // l.since() before which no session opens to spread load

	stats   counters
	metrics metrics
	tracer  telemetry.Tracer
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
		tracer:  telemetry.NewTracer(cfg.TracerProvider),
	}
	l.conn = pgsession.Config{
		Pool: pool, PingInterval: cfg.PingInterval, PingTimeout: cfg.PingTimeout, SessionPooler: cfg.SessionPooler,
		AppName: appname.Of("advisory", cfg.Owner), Logger: cfg.Logger, Stats: &l.stats.Counters, PingsFailed: l.metrics.renewFailed,
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

func (l *Locker) acquire(ctx context.Context, key Key, shared, wait bool) (_ *Lock, err error) {
	start := l.metrics.start()
	var span trace.Span = noop.Span{}
	if ctx != nil {
		if start.IsZero() && l.tracer.On() {
			// For the span's wait, with metrics off: read before the span
			// starts, so the wait it reports covers the span's whole
			// stretch up to the grant (read after, a goroutine switched out
			// between the two left the unlock it waited for before it).
			start = time.Now()
		}
		ctx, span = l.tracer.Start(ctx, "pgbaton.advisory.lock", "advisory")
	}
	lk, contended, err := l.acquireKey(ctx, key, shared, wait)
	defer func() {
		if span.IsRecording() {
			traceLock(span, l.cfg.Owner, key, shared, wait, start, contended, err)
		}
	}()
	l.metrics.attempt(key, start, err, contended)
	if err != nil {
		l.logRefusal("lock "+key.String(), err)
		return nil, err
	}
	if ctx.Err() != nil {
		// Taken, but the caller gave up meanwhile: do not hand out a lock
		// nobody will unlock. The metrics counted it as acquired, and the
		// Unlock ends its hold, so pgbaton.held stays balanced.
		_ = lk.Unlock(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("advisory: lock %s: %w", key, context.Cause(ctx))
	}
	return lk, nil
}

// acquireKey takes key in three steps: resolve it (and record its name),
// take this Locker's turn for it among its own goroutines (Postgres
// advisory locks are re-entrant per session, so exclusion between
// goroutines is ours to keep), and take it from the server. contended
// tells the metrics the key was found held.
func (l *Locker) acquireKey(ctx context.Context, key Key, shared, wait bool) (_ *Lock, contended bool, _ error) {
	id, err := l.resolve(ctx, key)
	if err != nil {
		return nil, false, err
	}
	for {
		turn := l.enter(key, id, shared, wait)
		switch {
		case turn.err != nil:
			return nil, contended || turn.contended, turn.err
		case turn.joined != nil:
			return turn.joined, contended, nil
		case turn.after != nil:
			contended = true
			if err := l.awaitTurn(ctx, key, turn.after); err != nil {
				return nil, contended, err
			}
			continue
		}
		s, err := l.take(ctx, key, id, shared, wait, turn.entry, &contended)
		lk, err := l.settleTurn(key, id, shared, turn.entry, s, err)
		return lk, contended, err
	}
}

// resolve checks ctx and key, maps the key to its lock id and, for a
// name, records it in the registry.
func (l *Locker) resolve(ctx context.Context, key Key) (lockID, error) {
	if ctx == nil {
		return lockID{}, fmt.Errorf("%w: nil context", pgbaton.ErrInvalidArgument)
	}
	id, err := key.resolve(l.cfg.Namespace)
	if err != nil {
		return lockID{}, err
	}
	if key.kind == kindName {
		if err := l.register(ctx, key.name, id.ID); err != nil {
			// Behind a transaction pooler the registry's upsert through the
			// pool can fail in ways that say nothing of the pooler (another
			// client's prepared statement on the same backend): then the
			// pooler is what to report.
			if serr := l.sessionCheck(ctx); errors.Is(serr, ErrSessionPooling) {
				return lockID{}, serr
			}
			return lockID{}, err
		}
	}
	return id, nil
}

// turn is the outcome of entering the Locker's bookkeeping for a key:
// exactly one field is set. entry: the key is ours to take from the
// server; joined: a shared lock joined another goroutine's; after: wait
// for this channel, then enter again; err: give up.
type turn struct {
	entry     *entry
	joined    *Lock
	after     <-chan struct{}
	err       error
	contended bool
}

// enter takes this goroutine's turn for key in the Locker's bookkeeping.
func (l *Locker) enter(key Key, id lockID, shared, wait bool) turn {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return turn{err: fmt.Errorf("advisory: lock %s: %w", key, pgbaton.ErrClosed)}
	}
	if e := l.entries[id]; e != nil {
		// Another goroutine of this Locker holds or is taking the key.
		if !e.busy && shared && e.shared && e.sess.Alive() {
			lk := l.newLock(key, id, true, e.sess)
			e.locks[lk] = struct{}{}
			return turn{joined: lk}
		}
		if !wait && (!e.busy || e.waiting) {
			l.stats.contended.Add(1)
			return turn{err: fmt.Errorf("%w: %s is held in this process", ErrLocked, key), contended: true}
		}
		return turn{after: e.wait()}
	}
	if l.total >= l.cfg.MaxLocks {
		return turn{err: fmt.Errorf("%w: this Locker holds Config.MaxLocks = %d locks already", ErrLockTableFull, l.cfg.MaxLocks)}
	}
	e := &entry{shared: shared, busy: true, locks: make(map[*Lock]struct{}, 1)}
	l.entries[id] = e
	l.total++
	return turn{entry: e}
}

// awaitTurn waits for another goroutine's turn for key to end.
func (l *Locker) awaitTurn(ctx context.Context, key Key, after <-chan struct{}) error {
	select {
	case <-after:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("advisory: lock %s: %w", key, context.Cause(ctx))
	case <-l.ctx.Done():
		return fmt.Errorf("advisory: lock %s: %w", key, pgbaton.ErrClosed)
	}
}

// settleTurn ends this goroutine's turn for key after take: on success
// the lock is recorded on its session; on failure (or a session lost or a
// Locker closed meanwhile) the entry goes. Either way goroutines waiting
// for the turn are woken.
func (l *Locker) settleTurn(key Key, id lockID, shared bool, e *entry, s *session, err error) (*Lock, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.busy, e.waiting = false, false
	e.notify()
	if err == nil && l.closed {
		err = fmt.Errorf("advisory: lock %s: %w", key, pgbaton.ErrClosed)
	}
	if err == nil {
		select {
		case <-s.Done(): // lost since: its locks went with it
			err = fmt.Errorf("advisory: lock %s: %w", key, s.Cause())
		default:
		}
	}
	if err != nil {
		delete(l.entries, id)
		l.total--
		if s != nil {
			s.count--
		}
		return nil, err
	}
	lk := l.newLock(key, id, shared, s)
	e.sess = s
	e.locks[lk] = struct{}{}
	return lk, nil
}

// take gets the lock from the server: first with a try on a shared
// session, then, for a waiting call, with a blocking wait on a connection
// of its own that becomes a session once the lock is granted. A waiting
// call that finds a spare connection at hand (kept from an earlier wait)
// waits on it at once: the wait is granted at once if the key is free,
// in one round trip like a try, and a contended key costs no try first.
// On success the returned session's count includes the lock.
func (l *Locker) take(ctx context.Context, key Key, id lockID, shared, wait bool, e *entry, contended *bool) (*session, error) {
	if wait {
		if sp, ok := l.takeSpare(); ok {
			l.markWaiting(e)
			s, err := l.wait(ctx, id, shared, sp, contended)
			if err != nil {
				return nil, fmt.Errorf("advisory: lock %s: %w", key, err)
			}
			return s, nil
		}
	}
	s, err := l.reserveSession(ctx)
	if err != nil {
		return nil, err
	}
	op := pgsession.Try
	if shared {
		op = pgsession.TryShared
	}
	ok, err := s.DoClaimed(op, id)
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
	l.markWaiting(e)
	s, err = l.wait(ctx, id, shared, nil, contended)
	if err != nil {
		return nil, fmt.Errorf("advisory: lock %s: %w", key, err)
	}
	return s, nil
}

// markWaiting records that a blocking wait for e's key is under way, so
// that try-lockers waiting on the outcome can give up now.
func (l *Locker) markWaiting(e *entry) {
	l.mu.Lock()
	e.waiting = true
	e.notify()
	l.mu.Unlock()
}

// sessionCheck opens a session if none is open, or fails why it cannot.
func (l *Locker) sessionCheck(ctx context.Context) error {
	s, err := l.reserveSession(ctx)
	if err != nil {
		return err
	}
	s.Unclaim() // no request follows
	l.unreserve(s)
	return nil
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
			s.Claim()
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
	s, err = l.openSession(ctx)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		s.retire()
		return nil, pgbaton.ErrClosed
	}
	s.shared = true
	s.count++
	s.Claim()
	l.sessions = append(l.sessions, s)
	l.mu.Unlock()
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
		if s.count < l.cfg.MaxLocksPerSession && s.Alive() {
			if s.Pending() < spreadDepth {
				return s
			}
			roomy++
			if busy == nil || s.Pending() < busy.Pending() {
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
// busy enough to spread new ones to another. One backend runs its
// requests one after another, on one server core; past a few callers at
// once it is the limit. Measured on 2 cores with 8 goroutines looping
// TryLock+Unlock (bench, uncontended scenario, 3 runs each, two rounds
// interleaved): one session (depth 16) did 17.7k and 25.2k ops/s, two
// sessions 30.7k and 29.7k at depth 3, 25.6k and 28.3k at depth 2.
const spreadDepth = 3

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
		if s, ok := l.takeSpare(); ok {
			l.mu.Lock()
			if l.closed {
				l.mu.Unlock()
				l.dropSpare(s)
				return
			}
			s.shared = true
			l.sessions = append(l.sessions, s)
			l.mu.Unlock()
			return
		}
		s, err := l.openSession(l.ctx)
		l.mu.Lock()
		if err != nil {
			l.spreadAt = l.since() + l.cfg.RetryDelay
			l.mu.Unlock()
			if l.ctx.Err() == nil {
				l.cfg.Logger.Warn("advisory: could not open a session to spread load", "error", err)
			}
			return
		}
		if l.closed {
			l.mu.Unlock()
			s.retire()
			return
		}
		s.shared = true
		l.sessions = append(l.sessions, s)
		l.mu.Unlock()
	}()
}

// unreserve gives back a lock counted in by reserveSession or held on s.
// A session that falls idle may be parked: it is kept, goroutine and all,
// as a spare for the next blocking wait. That is a hand-over in the Locker's
// books, without a round trip, unless an unlock found the backend holding
// less than it should (then everything is released first, in the
// background).
func (l *Locker) unreserve(s *session) {
	l.mu.Lock()
	s.count--
	park := l.parkLocked(s)
	l.mu.Unlock()
	if !park {
		return
	}
	if !s.Dirty() {
		l.parkSession(s)
		return
	}
	go l.parkSession(s)
}

// parkSession keeps the idle session s as a spare, cleared first if an
// unlock found its backend holding less than it should.
func (l *Locker) parkSession(s *session) {
	defer l.bg.Done()
	if s.Clear() != nil {
		return // the session ends
	}
	l.addSpare(s)
}

// maxSpares bounds the idle sessions kept for blocking waits.
const maxSpares = 2

// addSpare keeps s, idle and holding no locks, for a later wait.
func (l *Locker) addSpare(s *session) {
	l.mu.Lock()
	if l.closed || len(l.spares) >= maxSpares || !s.Alive() {
		l.mu.Unlock()
		l.dropSpare(s)
		return
	}
	l.spares = append(l.spares, s)
	l.mu.Unlock()
}

// takeSpare returns a kept idle session, or ok false.
func (l *Locker) takeSpare() (*session, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.spares) == 0 {
		return nil, false
	}
	s := l.spares[len(l.spares)-1]
	l.spares = l.spares[:len(l.spares)-1]
	return s, true
}

// dropSpare ends an idle session that holds no locks and is in no list.
func (l *Locker) dropSpare(s *session) { s.retire() }

// parkLocked decides, with l.mu held, whether an idle session leaves the
// sessions that take new locks, to be parked as a spare (or retired, that
// is closed, when the spares are full). A session made from a granted wait
// goes as soon as another session has room; shared sessions are kept up
// to MaxSessionsUnderLoad with room, so that load spread over them does
// not open and close a session at every lull. When it returns true the
// caller must park s (parkSession) and so call l.bg.Done.
func (l *Locker) parkLocked(s *session) bool {
	if s.count > 0 || l.closed {
		return false
	}
	keep := 1
	if s.shared {
		keep = l.cfg.MaxSessionsUnderLoad
	}
	others := 0
	for _, o := range l.sessions {
		if o != s && o.Alive() && o.count < l.cfg.MaxLocksPerSession {
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

// sessionEnded runs once when s is lost or closed (see watch): every
// lock on it is cancelled with the cause, and its keys are free to be
// taken again (on another session).
func (l *Locker) sessionEnded(s *session, cause error) (lost int, spare bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s.count == 0 && !slices.Contains(l.sessions, s) {
		// A spare (kept, or taken for a wait) or a wait's session: it held
		// nothing. A kept one noticed its connection had gone: the next
		// wait opens another.
		l.spares = slices.DeleteFunc(l.spares, func(o *session) bool { return o == s })
		return 0, true
	}
	l.removeSession(s)
	if !errors.Is(cause, pgbaton.ErrClosed) {
		l.stats.lostSessions.Add(1)
		l.reopen.Store(true)
	}
	if s.count == 0 {
		return 0, false // an idle shared session: no lock held or being taken
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
	return lost, false
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
	for _, s := range spares {
		l.dropSpare(s)
	}
	return errors.Join(errs...)
}
