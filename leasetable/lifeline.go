package leasetable

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// lifeline is a client's lifeline: one row of pgbaton.lease_session
// that one keep-alive per RenewInterval keeps alive for every lease bound
// to it, however many. A lease bound to a lifeline is valid in the database
// while its own grant (or explicit Renew) has not expired or its lifeline
// is alive; locally it is held until the later of its own deadline and the
// lifeline's, each started before the request that set it was sent and
// shortened by the safety margin, so the holder learns of a loss before
// the database lets anyone else take the lease.
//
// A lifeline is never revived: a keep-alive that arrives after the
// lifeline's expiry fails, and the client opens a new lifeline for new
// grants. The leases of a dead lifeline end at their own deadlines.
type lifeline struct {
	c  *Client
	id int64

	// base carries the monotonic clock; deadline is an offset from it, so
	// leases read the lifeline's deadline without a lock.
	base     time.Time
	deadline atomic.Int64  // time.Duration since base
	state    atomic.Uint32 // lifelineAlive, then lifelineDead or lifelineClosed (stop)
	failing  atomic.Bool   // the last keep-alive failed
	inflight atomic.Bool   // a keep-alive is on its way

	mu        sync.Mutex // guards the fields below; lock order in internals.go
	expiresAt time.Time  // database clock, as of the last keep-alive
	renewedAt time.Time  // local: when the last successful keep-alive was sent
	revoked   int64
	// epoch is the token epoch the last keep-alive (or the open) saw: a
	// new one means a timeline change, which may have lost grants bound
	// to the lifeline while the lifeline itself reached the new primary.
	epoch int64
	// recheck: looking for lost grants failed; look again after the next
	// keep-alive.
	recheck bool
	// sentAt (monotonic) and dbAt (database clock) are when the last
	// request that told the database's clock (session_open, a keep-alive)
	// was sent and ran there: the next keep-alive compares how far each
	// clock moved since (clockStep).
	sentAt    time.Time
	dbAt      time.Time
	orphans   []pgtype.UUID // request ids whose grants could not be given back yet
	idleSince time.Time     // when the last lease left, or zero while some are bound
	keepT     *time.Timer
	deadT     *time.Timer
	stopKeep  context.CancelFunc

	// leases bound to the lifeline, guarded by setMu (a leaf lock; see
	// internals.go).
	setMu  sync.Mutex
	leases map[*Lease]struct{}
}

// A lifeline is alive until stop moves it, once, to one of two final
// states, by why it ended.
const (
	lifelineAlive uint32 = iota
	// lifelineDead: lost: its local deadline passed, or the database no
	// longer has it. Its leases are lost at their own deadlines.
	lifelineDead
	// lifelineClosed: ended on purpose, by Close or after a TTL idle: a
	// keep-alive it cancels is not a failure.
	lifelineClosed
)

// dead reports whether the lifeline ended, either way.
func (s *lifeline) dead() bool { return s.state.Load() != lifelineAlive }

// lifelineFor returns the lifeline new grants bind to, opening one when
// there is none or the current one is dead.
func (c *Client) lifelineFor(ctx context.Context) (*lifeline, error) {
	// A semaphore rather than a mutex: a grant waiting behind another
	// grant's session_open gives up at its own context's deadline.
	select {
	case c.lineSem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	c.mu.Lock()
	s := c.line
	c.mu.Unlock()
	if s != nil && !s.dead() && time.Now().Before(s.until()) {
		<-c.lineSem
		return s, nil
	}
	// Opened to the end even when the caller gives up (inFlight): the
	// next grant binds to it, and the pool keeps its connection. The
	// semaphore is held until then.
	var once sync.Once
	unlock := func() { once.Do(func() { <-c.lineSem }) }
	defer unlock()
	return inFlight(c, ctx, func(ctx context.Context) (*lifeline, error) {
		defer unlock()
		return c.openLifeline(ctx)
	}, nil)
}

// openLifeline opens a lease session and makes it the one new grants bind
// to.
func (c *Client) openLifeline(ctx context.Context) (*lifeline, error) {
	start := time.Now()
	// A repeat after a broken connection may leave an unused lifeline
	// behind; it expires at its TTL.
	var row db.SessionOpenRow
	err := c.retry(ctx, true, func(ctx context.Context) (err error) {
		row, err = c.q.SessionOpen(ctx, c.pool, db.SessionOpenParams{Owner: c.cfg.Owner, TtlMs: c.ttlMs})
		return err
	})
	if err != nil {
		return nil, c.dbError("open lease session", err)
	}
	s := &lifeline{c: c, id: row.ID, epoch: row.Epoch, base: start, expiresAt: row.ExpiresAt, renewedAt: start,
		sentAt: start, dbAt: row.ExpiresAt.Add(-time.Duration(c.ttlMs) * time.Millisecond),
		idleSince: start, leases: make(map[*Lease]struct{})}
	s.deadline.Store(int64(c.cfg.TTL - c.cfg.SafetyMargin))
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.goBackground(func(ctx context.Context) { s.close(ctx) })
		return nil, errClosedDuringOpen
	}
	c.line = s
	c.mu.Unlock()
	s.mu.Lock()
	s.keepT = time.AfterFunc(c.cfg.RenewInterval, c.tracked(s.keepalive))
	s.deadT = time.AfterFunc(time.Until(s.until()), c.tracked(s.checkDeadline))
	s.mu.Unlock()
	c.log.Debug("pgbaton: lease session opened", "session", s.id)
	return s, nil
}

var errClosedDuringOpen = fmt.Errorf("%w: the client closed while a lease session was opened", pgbaton.ErrClosed)

// param is the lifeline as the grant functions take it.
func (s *lifeline) param() pgtype.Int8 { return pgtype.Int8{Int64: s.id, Valid: true} }

// until is the lifeline's local deadline.
func (s *lifeline) until() time.Time {
	return s.base.Add(time.Duration(s.deadline.Load()))
}

// carries reports whether the lifeline keeps leases alive now: it is not
// dead and its deadline has not passed.
func (s *lifeline) carries(now time.Time) bool {
	return !s.dead() && now.Before(s.until())
}

// bind adds l to the leases the lifeline keeps alive.
func (s *lifeline) bind(l *Lease) {
	s.setMu.Lock()
	s.leases[l] = struct{}{}
	s.setMu.Unlock()
}

// unbind removes l; the last lease to leave starts the idle clock.
func (s *lifeline) unbind(l *Lease) {
	s.setMu.Lock()
	delete(s.leases, l)
	s.setMu.Unlock()
}

// bound returns the leases bound now.
func (s *lifeline) bound() []*Lease {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	out := make([]*Lease, 0, len(s.leases))
	for l := range s.leases {
		out = append(out, l)
	}
	return out
}

// keepalive runs on the keep-alive timer.
func (s *lifeline) keepalive() {
	c := s.c
	s.mu.Lock()
	if s.dead() {
		s.mu.Unlock()
		return
	}
	now := time.Now()
	if !now.Before(s.until()) {
		// Woken late (the process was paused): too late to keep it alive.
		s.mu.Unlock()
		s.die("the local deadline passed before the keep-alive was due to be sent")
		return
	}
	s.setMu.Lock()
	n := len(s.leases)
	s.setMu.Unlock()
	if n > 0 {
		s.idleSince = time.Time{}
	} else if s.idleSince.IsZero() {
		s.idleSince = now
	} else if now.Sub(s.idleSince) >= c.cfg.TTL {
		// Unused for a TTL: let it go rather than write for nothing. The
		// next grant opens a new lifeline.
		s.mu.Unlock()
		s.retire()
		return
	}
	ctx, cancel := context.WithDeadline(c.bg, s.until())
	s.stopKeep = cancel
	s.inflight.Store(true)
	s.mu.Unlock()

	c.awaitIdle(ctx, min(c.cfg.RenewInterval, time.Until(s.until()))/4)
	start := time.Now()
	var row db.SessionKeepaliveRow
	err := c.retry(ctx, true, func(ctx context.Context) (err error) {
		row, err = c.q.SessionKeepalive(ctx, c.pool, db.SessionKeepaliveParams{ID: s.id, TtlMs: c.ttlMs})
		return err
	})
	replied := time.Now()
	cancel()
	if err != nil {
		s.failing.Store(true) // before inflight clears: trouble() never blinks
	}
	s.inflight.Store(false)

	if err != nil && s.state.Load() != lifelineClosed {
		// Failed, or hung until the deadline; not stopped by Close.
		c.renewFailed("", err)
	}
	s.mu.Lock()
	s.stopKeep = nil
	if s.dead() {
		s.mu.Unlock()
		return
	}
	var step time.Duration
	if err == nil {
		step = s.clockStep(start, replied, row.ServerNow)
	}
	switch {
	case err == nil && row.Alive:
		if s.failing.Swap(false) {
			c.log.Info("pgbaton: lease keep-alive succeeded again", "session", s.id)
		}
		if d := start.Add(c.cfg.TTL - c.cfg.SafetyMargin).Sub(s.base); d > time.Duration(s.deadline.Load()) {
			s.deadline.Store(int64(d))
			s.expiresAt, s.renewedAt = row.ExpiresAt, start
		}
		revoked := row.Revoked != s.revoked
		failedOver := row.Epoch != s.epoch
		recheck := s.recheck
		s.revoked, s.epoch, s.recheck = row.Revoked, row.Epoch, false
		orphans := s.orphans
		s.orphans = nil
		s.keepT.Reset(c.cfg.RenewInterval)
		s.mu.Unlock()
		if step > c.cfg.SafetyMargin {
			c.clockStepped(s, true, step)
		}
		if revoked || failedOver || recheck {
			c.goBackground(func(ctx context.Context) { s.findLost(ctx, failedOver) })
		}
		for _, ref := range orphans {
			c.goBackground(func(ctx context.Context) { c.releaseRef(ctx, s, ref) })
		}
		if c.hasUnreturned() {
			c.goBackground(c.returnUnreturned)
		}
		s.afterKeepalive()
	case err == nil:
		// The database no longer has the lifeline (it expired there first,
		// or a failover lost it): its leases are valid by their own
		// expiry only — and not even that when the database's clock
		// stepped past it.
		s.mu.Unlock()
		if step > c.cfg.SafetyMargin {
			c.clockStepped(s, false, step)
		}
		s.die("the database no longer has the lease session")
	default:
		s.failing.Store(true)
		retry := max(c.cfg.RenewInterval/5, time.Millisecond)
		c.log.Warn("pgbaton: lease keep-alive failed; retrying", "session", s.id, "leases", n,
			"retry_in", retry, "until", time.Until(s.until()), "error", err)
		s.keepT.Reset(retry)
		s.mu.Unlock()
	}
}

// awaitIdle waits, up to d, until one of the pool's connections is idle
// (or the pool has none open), so that the keep-alive sent next takes that
// one. The keep-alive runs on a timer, beside whatever the client's
// callers send: sent while every connection was busy, it made the pool
// open one more, for good (500 clients with pools of 2 on 2 cores: 0.9
// connections opened per client in a 10s run, most of them beside a
// keep-alive, and each backend start slowed every other call). A client's
// callers are idle most of the time, so waiting for that costs the
// keep-alive a few milliseconds; the wait is bounded to leave the
// lifeline's deadline its slack for retries. It only looks at the pool's
// counts: taking the idle connections (AcquireAllIdle) would skip the
// pool's checks of a stale connection and, releasing the others, keep
// them from ever ageing out (MaxConnIdleTime).
func (c *Client) awaitIdle(ctx context.Context, d time.Duration) {
	until := time.Now().Add(d)
	for {
		if st := c.pool.Stat(); st.IdleConns() > 0 || st.TotalConns() == 0 {
			return
		}
		wait := min(idlePoll, time.Until(until))
		if wait <= 0 {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// idlePoll is how often awaitIdle looks for an idle connection.
const idlePoll = 5 * time.Millisecond

// clockStep returns how much further the database's clock moved than the
// client's monotonic clock, from the last request that told the database's
// clock to the keep-alive sent at sent, answered at replied, that ran at
// dbNow; and makes that keep-alive the next one's reference. Called with
// s.mu held.
//
// The client's side counts from the earlier request's send to this reply,
// the longest the time between the two could have been, so a slow round
// trip never looks like a step: the result is at most the step, and at
// least the step minus the two round trips. A client whose monotonic
// clock stood still (its machine was suspended) sees the database's clock
// step by as much.
func (s *lifeline) clockStep(sent, replied, dbNow time.Time) time.Duration {
	step := dbNow.Sub(s.dbAt) - replied.Sub(s.sentAt)
	s.sentAt, s.dbAt = sent, dbNow
	return step
}

// clockStepped handles a forward step of the database's clock by more
// than the safety margin, seen by a keep-alive of s (alive: the keep-alive
// found s and extended it). Every lease's local deadline assumed that the
// database's clock moves no faster than the client's, so the database may
// have let leases go before their holders' deadlines: every lease the
// client holds is lost now, except those that s carries when alive — the
// database found s unexpired, so it let none of them go, and measures
// their expiry from the stepped clock from now on.
func (c *Client) clockStepped(s *lifeline, alive bool, step time.Duration) {
	why := fmt.Sprintf("the database's clock moved %s further than this client's since the previous keep-alive, more than the safety margin %s",
		step.Round(time.Millisecond), c.cfg.SafetyMargin)
	c.mu.Lock()
	leases := make([]*Lease, 0, len(c.leases))
	for l := range c.leases {
		leases = append(leases, l)
	}
	c.mu.Unlock()
	affected := leases[:0]
	for _, l := range leases {
		l.mu.Lock()
		if l.state == leaseHeld && (!alive || l.line != s) {
			affected = append(affected, l)
		}
		l.mu.Unlock()
	}
	// Logged and counted before any holder is told, so that whoever wakes
	// on Done finds the step in the log and the metrics.
	c.log.Warn("pgbaton: database clock stepped forward", "session", s.id, "step", step, "leases_lost", len(affected),
		"error", fmt.Errorf("%w: %s", ErrClockStep, why))
	if c.tel != nil {
		c.tel.ClockStepped(context.Background())
	}
	for _, l := range affected {
		l.mu.Lock()
		// Only a lease still held: one released or handed off meanwhile
		// stays so.
		if l.state == leaseHeld {
			l.transitionLocked(leaseLost, fmt.Errorf("%w: %w: %q token %d: %s", ErrLeaseLost, ErrClockStep, l.name, l.token, why), CauseClockStep)
		}
		l.mu.Unlock()
	}
}

// checkDeadline runs on the deadline timer.
func (s *lifeline) checkDeadline() {
	s.mu.Lock()
	if s.dead() {
		s.mu.Unlock()
		return
	}
	if d := time.Until(s.until()); d > 0 { // a keep-alive moved it
		s.deadT.Reset(d)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.die("no successful keep-alive before the local deadline")
}

// die ends the lifeline: no keep-alive is sent any more, and every lease
// bound to it is now held only until its own deadline — those past it are
// lost at once.
func (s *lifeline) die(why string) {
	// Read before stop cancels a keep-alive in flight.
	trouble := s.trouble()
	if !s.stop(lifelineDead) {
		return
	}
	c := s.c
	leases := s.bound()
	c.log.Warn("pgbaton: lease session lost", "session", s.id, "leases", len(leases), "reason", why)
	for _, l := range leases {
		l.lifelineEnded(trouble)
	}
	c.forgetLifeline(s)
}

// retire ends an idle lifeline and deletes its row.
func (s *lifeline) retire() {
	if !s.stop(lifelineClosed) {
		return
	}
	s.c.forgetLifeline(s)
	s.c.goBackground(s.close)
	// A lease bound since the idle check holds by its own deadline.
	for _, l := range s.bound() {
		l.lifelineEnded(false)
	}
}

// trouble reports whether keep-alives are failing or one hangs in flight:
// a loss now is a renewal failure rather than an expiry.
func (s *lifeline) trouble() bool { return s.failing.Load() || s.inflight.Load() }

// stop ends the lifeline, as lifelineDead or lifelineClosed, and stops its
// timers and a keep-alive in flight; false if it had ended already.
func (s *lifeline) stop(to uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.state.CompareAndSwap(lifelineAlive, to) {
		return false
	}
	s.keepT.Stop()
	s.deadT.Stop()
	if s.stopKeep != nil {
		s.stopKeep()
	}
	return true
}

// close deletes the lifeline's row; leases still bound keep only their own
// expiry. Best effort: a lifeline that is not closed expires at its TTL.
func (s *lifeline) close(ctx context.Context) {
	ctx, cancel := s.c.cleanupContext(ctx)
	defer cancel()
	if err := s.c.q.SessionClose(ctx, s.c.pool, s.id); err != nil {
		s.c.log.Debug("pgbaton: closing lease session failed; it expires at its TTL", "session", s.id, "error", err)
	}
}

// findLost ends the leases of the lifeline that the database no longer
// has: force-released by an operator, or, after a timeline change
// (failedOver), granted by the old primary and lost with it. The
// failover grace keeps such a lease from being granted again until this
// had time to run.
func (s *lifeline) findLost(ctx context.Context, failedOver bool) {
	c := s.c
	leases := s.bound()
	if len(leases) == 0 {
		return
	}
	names, tokens := grants(leases)
	ctx, cancel := context.WithTimeout(ctx, c.cfg.TTL)
	defer cancel()
	lost, err := c.q.SessionLost(ctx, c.pool, db.SessionLostParams{Session: s.id, Names: names, Tokens: tokens, Owner: c.cfg.Owner})
	if err != nil {
		c.log.Warn("pgbaton: checking for leases the database no longer has failed", "session", s.id, "error", err)
		s.mu.Lock()
		s.recheck = true
		s.mu.Unlock()
		return
	}
	gone := make(map[string]bool, len(lost))
	for _, n := range lost {
		gone[n] = true
	}
	why := "was released by an operator"
	if failedOver {
		why = "is not in the database after a timeline change (a failover lost its grant), or was released by an operator"
	}
	for _, l := range leases {
		if gone[l.name] {
			l.lose(fmt.Errorf("%w: %w: %q token %d %s", ErrLeaseLost, ErrNotHeld, l.name, l.token, why), CauseSuperseded)
		}
	}
}

// afterKeepalive runs the hooks of leases that want to know of each
// successful keep-alive (job run heartbeats), in the background.
func (s *lifeline) afterKeepalive() {
	var hooks []func(context.Context)
	for _, l := range s.bound() {
		l.mu.Lock()
		if l.afterRenew != nil && !l.state.ended() {
			hooks = append(hooks, l.afterRenew)
		}
		l.mu.Unlock()
	}
	for _, h := range hooks {
		s.c.goBackground(func(ctx context.Context) {
			ctx, cancel := context.WithTimeout(ctx, s.c.cfg.RenewInterval)
			defer cancel()
			h(ctx)
		})
	}
}

// overdue reports whether the lifeline's last successful keep-alive is
// older than limit, and how long ago it was sent.
func (s *lifeline) overdue(limit time.Duration) (bool, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	since := time.Since(s.renewedAt)
	return since > limit, since
}

// tracked wraps fn, run on a timer, so that Close waits for it; after
// Close has begun it does nothing.
func (c *Client) tracked(fn func()) func() {
	return func() {
		if !c.enter() {
			return
		}
		defer c.background.Done()
		fn()
	}
}

// forgetLifeline drops s as the lifeline for new grants.
func (c *Client) forgetLifeline(s *lifeline) {
	c.mu.Lock()
	if c.line == s {
		c.line = nil
	}
	c.mu.Unlock()
}

// closeLifeline ends the client's lifeline for good at Close: its row is
// deleted (leases not given back keep only their own expiry).
func (c *Client) closeLifeline(ctx context.Context) error {
	c.mu.Lock()
	s := c.line
	c.line = nil
	c.mu.Unlock()
	if s == nil {
		return nil
	}
	if !s.stop(lifelineClosed) {
		return nil
	}
	for _, l := range s.bound() {
		l.lifelineEnded(false)
	}
	ctx, cancel := c.cleanupContext(ctx)
	defer cancel()
	if err := c.q.SessionClose(ctx, c.pool, s.id); err != nil && !errors.Is(err, context.Canceled) {
		return c.dbError("close lease session", err)
	}
	return nil
}
