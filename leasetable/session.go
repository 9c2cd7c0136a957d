package leasetable

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// session is a client's lease session, a row of pgbaton.lease_session
// (the package doc says what it carries). A lease is held locally until
// the later of its own deadline and its session's. The keeper owns it; the
// atomics are what leases and grants read without asking.
type session struct {
	id int64

	// base carries the monotonic clock; deadline is an offset from it.
	base     time.Time
	deadline atomic.Int64  // time.Duration since base
	expires  atomic.Int64  // database clock, unix ns, as of the last keep-alive
	state    atomic.Uint32 // sessionAlive, then sessionDead or sessionClosed
	failing  atomic.Bool   // the last keep-alive failed
	inflight atomic.Bool   // a keep-alive is on its way
	closing  atomic.Bool   // the keeper is deciding to close it idle (keepalive)

	// The keeper's own.
	keepAt    time.Time          // when the next keep-alive is due
	keeping   bool               // a keep-alive is on its way
	stopKeep  context.CancelFunc // ends the keep-alive on its way
	renewedAt time.Time          // when the last successful keep-alive was sent
	idleSince time.Time          // when the last lease left, or zero while some are held
	revoked   int64
	// epoch is the token epoch the last keep-alive saw: a new one is a
	// timeline change, which may have lost grants of a session that
	// reached the new primary itself.
	epoch   int64
	recheck bool // looking for lost grants failed: look after the next keep-alive
	// sentAt (monotonic) and dbAt (database clock) are when the last
	// request that told the database's clock was sent and ran (clockStep).
	sentAt, dbAt time.Time
}

// A session is alive until the keeper ends it, once: dead (its local
// deadline passed, or the database no longer has it) or closed (by Close
// or after a TTL idle: a keep-alive it cancels is not a failure).
const (
	sessionAlive uint32 = iota
	sessionDead
	sessionClosed
)

// param is the session as the grant functions take it.
func (s *session) param() pgtype.Int8 { return pgtype.Int8{Int64: s.id, Valid: true} }

// until is the session's local deadline.
func (s *session) until() time.Time { return s.base.Add(time.Duration(s.deadline.Load())) }

// carries reports whether the session keeps leases alive now: it has not
// ended and its deadline has not passed.
func (s *session) carries(now time.Time) bool {
	return s.state.Load() == sessionAlive && now.Before(s.until())
}

// trouble reports whether keep-alives are failing or one hangs in flight:
// a loss now is a renewal failure rather than an expiry.
func (s *session) trouble() bool { return s.failing.Load() || s.inflight.Load() }

// extend moves the session's deadline and expiry forward after a
// keep-alive sent at sent found it alive (one is on its way at a time).
func (s *session) extend(c *Client, sent time.Time, expires time.Time) {
	if d := sent.Add(c.cfg.TTL - c.cfg.SafetyMargin).Sub(s.base); d > time.Duration(s.deadline.Load()) {
		s.deadline.Store(int64(d))
		s.expires.Store(expires.UnixNano())
	}
}

// opening is a session being opened; done closes when s or err is set.
type opening struct {
	done chan struct{}
	s    *session
	err  error
}

// sessionFor returns the session new grants bind to, having the keeper
// open one if needed, and counts the caller as a user of it until the
// caller's unuse: a session in use is not closed idle (keepalive), so a
// grant on its way is never bound to a session closed under it, which left
// its lease to its own expiry, lost a TTL later on a healthy client. A
// caller that gives up returns at once; the session is opened all the
// same.
func (c *Client) sessionFor(ctx context.Context) (*session, error) {
	c.k.using.Add(1) // before the session is read: see keepalive
	s, err := c.takeSession(ctx)
	if err != nil {
		c.k.using.Add(-1)
		return nil, err
	}
	if c.sessionTaken != nil {
		c.sessionTaken()
	}
	return s, nil
}

// sessionTaken, when set by a test before it makes a client, runs after
// each grant took its session and before the grant is sent.
var sessionTaken func()

// unuse ends a use that sessionFor counted. It is a message, handled after
// the caller's leases were kept (add), so the keeper never sees the
// session unused while a lease it granted is not kept yet.
func (k *keeper) unuse() {
	if !k.post(func(k *keeper) { k.using.Add(-1) }) {
		k.using.Add(-1)
	}
}

// takeSession is sessionFor without the count.
func (c *Client) takeSession(ctx context.Context) (*session, error) {
	if s := c.k.cur.Load(); s != nil && s.carries(time.Now()) && !s.closing.Load() {
		return s, nil
	}
	got := make(chan *opening, 1)
	if !c.k.post(func(k *keeper) { got <- k.open() }) {
		return nil, pgbaton.ErrClosed
	}
	op := <-got
	select {
	case <-op.done:
		return op.s, op.err
	case <-ctx.Done():
		return nil, ctxErr(ctx)
	}
}

// open returns the current session if it carries leases, else the one
// being opened, opening one if none is.
func (k *keeper) open() *opening {
	now := time.Now()
	if s := k.sess; s != nil && s.carries(now) {
		op := &opening{done: make(chan struct{}), s: s}
		close(op.done)
		return op
	}
	if s := k.sess; s != nil {
		k.end(s, sessionDead, "no successful keep-alive before the local deadline")
	}
	if k.opening != nil {
		return k.opening
	}
	c := k.c
	op := &opening{done: make(chan struct{})}
	k.opening = op
	if k.spawn(func() {
		// Bounded by the TTL: a later reply is of no use.
		ctx, cancel := context.WithTimeout(c.bg, c.cfg.TTL)
		defer cancel()
		s, err := c.openSession(ctx)
		if k.post(func(k *keeper) { k.opened(op, s, err) }) {
			return
		}
		if s != nil {
			c.closeSessionRow(context.Background(), s)
			err = errClosedDuringOpen
		}
		op.err = err
		close(op.done)
	}) {
		return op
	}
	k.opening = nil
	op.err = pgbaton.ErrClosed
	close(op.done)
	return op
}

var errClosedDuringOpen = fmt.Errorf("%w: the client closed while a lease session was opened", pgbaton.ErrClosed)

// opened makes s, just opened, the session new grants bind to.
func (k *keeper) opened(op *opening, s *session, err error) {
	k.opening = nil
	if err == nil {
		k.sess = s
		k.cur.Store(s)
		s.keepAt = s.base.Add(k.c.cfg.RenewInterval)
		k.c.log.Debug("pgbaton: lease session opened", "session", s.id)
	}
	op.s, op.err = s, err
	close(op.done)
}

// openSession opens a lease session.
func (c *Client) openSession(ctx context.Context) (*session, error) {
	start := time.Now()
	// A repeat after a broken connection may leave a session unused until
	// its TTL.
	var row db.SessionOpenRow
	err := c.retry(ctx, true, func(ctx context.Context) (err error) {
		row, err = c.q.SessionOpen(ctx, c.pool, db.SessionOpenParams{Owner: c.cfg.Owner, TtlMs: c.ttlMs})
		return err
	})
	if err != nil {
		return nil, c.dbError("open lease session", err)
	}
	s := &session{id: row.ID, epoch: row.Epoch, base: start, renewedAt: start, idleSince: start,
		sentAt: start, dbAt: row.ExpiresAt.Add(-time.Duration(c.ttlMs) * time.Millisecond)}
	s.deadline.Store(int64(c.cfg.TTL - c.cfg.SafetyMargin))
	s.expires.Store(row.ExpiresAt.UnixNano())
	return s, nil
}

// keepalive sends s's keep-alive, or closes s when it has carried no lease
// and had no waiter for a TTL.
func (k *keeper) keepalive(s *session, now time.Time) {
	c := k.c
	n := len(k.live())
	switch {
	case n > 0 || k.inUse():
		s.idleSince = time.Time{}
	case s.idleSince.IsZero():
		s.idleSince = now
	case now.Sub(s.idleSince) >= c.cfg.TTL:
		// Unused for a TTL: let it go rather than write for nothing. The
		// next grant opens a new session. closing first, then the uses:
		// a grant counts its use first, then reads closing (sessionFor),
		// so one of the two sees the other (atomics are sequentially
		// consistent) and no grant takes a session closed under it.
		s.closing.Store(true)
		if !k.inUse() {
			k.end(s, sessionClosed, "idle")
			return
		}
		s.closing.Store(false)
		s.idleSince = time.Time{}
	}
	ctx, cancel := context.WithDeadline(c.bg, s.until())
	s.keeping, s.stopKeep = true, cancel
	s.inflight.Store(true)
	if !k.spawn(func() {
		defer cancel()
		c.awaitIdle(ctx, min(c.cfg.RenewInterval, time.Until(s.until()))/idleWaitShare)
		start := time.Now()
		ctx, span := c.tr.Start(ctx, spanKeepalive, "lease")
		var row db.SessionKeepaliveRow
		err := c.retry(ctx, true, func(ctx context.Context) (err error) {
			row, err = c.q.SessionKeepalive(ctx, c.pool, db.SessionKeepaliveParams{ID: s.id, TtlMs: c.ttlMs})
			return err
		})
		replied := time.Now()
		if span.IsRecording() {
			c.endKeepalive(span, s.id, n, row.Alive, err)
		}
		if err != nil {
			s.failing.Store(true) // before inflight clears: trouble() never blinks
		} else if row.Alive {
			// At once, not when the keeper reads the reply: a lease's Err
			// must not see a deadline this keep-alive moved.
			s.extend(c, start, row.ExpiresAt)
		}
		s.inflight.Store(false)
		k.post(func(k *keeper) { k.keptAlive(s, n, start, replied, row, err) })
	}) {
		cancel()
		s.keeping, s.stopKeep = false, nil
		s.inflight.Store(false)
	}
}

// inUse reports whether the session is in use without a lease: a waiter
// is queued on it, a grant is on its way (sessionFor), or grants are to be
// given back by request id, which finds them by their session.
func (k *keeper) inUse() bool {
	return k.using.Load() > 0 || len(k.refs) > 0 || k.sending
}

// keptAlive handles the reply to s's keep-alive, sent at start for n
// leases and answered at replied.
func (k *keeper) keptAlive(s *session, n int, start, replied time.Time, row db.SessionKeepaliveRow, err error) {
	c := k.c
	s.keeping, s.stopKeep = false, nil
	if err != nil && s.state.Load() != sessionClosed {
		// Failed, or hung until the deadline; not stopped by Close.
		c.renewFailed("", err)
	}
	if s.state.Load() != sessionAlive {
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
		if start.After(s.renewedAt) {
			s.renewedAt = start
		}
		revoked, failedOver, recheck := row.Revoked != s.revoked, row.Epoch != s.epoch, s.recheck
		s.revoked, s.epoch, s.recheck = row.Revoked, row.Epoch, false
		s.keepAt = time.Now().Add(c.cfg.RenewInterval)
		if step > c.cfg.SafetyMargin {
			k.clockStepped(s, true, step)
		}
		if revoked || failedOver || recheck {
			k.findLost(s, failedOver)
		}
		k.sendBack()
		k.c.ln.RetryLeaving()
		k.afterKeepalive()
	case err == nil:
		// The database no longer has the session (it expired there first,
		// or a failover lost it): its leases are valid by their own expiry
		// only — and not even that when the database's clock stepped past
		// it.
		if step > c.cfg.SafetyMargin {
			k.clockStepped(s, false, step)
		}
		k.end(s, sessionDead, "the database no longer has the lease session")
	default:
		s.failing.Store(true)
		retry := max(c.cfg.RenewInterval/keepaliveRetries, time.Millisecond)
		c.log.Warn("pgbaton: lease keep-alive failed; retrying", "session", s.id, "leases", n,
			"retry_in", retry, "until", time.Until(s.until()), "error", err)
		s.keepAt = time.Now().Add(retry)
	}
}

// awaitIdle waits, up to d, until one of the pool's connections is idle
// (or none is open), so that the keep-alive takes that one: sent while
// every connection was busy, it made the pool open one more for good (500
// clients with pools of 2 on 2 cores: 0.9 connections opened per client in
// 10 s). It only reads the pool's counts: AcquireAllIdle would skip the
// pool's stale-connection checks and keep connections from ageing out.
func (c *Client) awaitIdle(ctx context.Context, d time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	t := time.NewTicker(idlePoll)
	defer t.Stop()
	for st := c.pool.Stat(); st.IdleConns() == 0 && st.TotalConns() > 0; st = c.pool.Stat() {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

const (
	idlePoll = 5 * time.Millisecond // how often awaitIdle looks
	// idleWaitShare: awaitIdle waits at most this share of RenewInterval
	// or of what is left to the deadline; keepaliveRetries: a failing
	// keep-alive is retried this many times per RenewInterval, so several
	// tries fit before the deadline.
	idleWaitShare    = 4
	keepaliveRetries = 5
)

// clockStep returns how much further the database's clock moved than the
// client's monotonic clock since the last request that told it, up to the
// keep-alive sent at sent, answered at replied, that ran at dbNow (the
// next one's reference). The client's side counts from the earlier send
// to this reply, so a slow round trip never looks like a step
// (docs/safety.md).
func (s *session) clockStep(sent, replied, dbNow time.Time) time.Duration {
	step := dbNow.Sub(s.dbAt) - replied.Sub(s.sentAt)
	s.sentAt, s.dbAt = sent, dbNow
	return step
}

// clockStepped handles a forward step of the database's clock by more
// than the safety margin, seen by a keep-alive of s: every lease held is
// lost now (the database may have let it go), except those s carries when
// alive (the keep-alive found s unexpired and extended it).
func (k *keeper) clockStepped(s *session, alive bool, step time.Duration) {
	c := k.c
	why := fmt.Sprintf("the database's clock moved %s further than this client's since the previous keep-alive, more than the safety margin %s",
		step.Round(time.Millisecond), c.cfg.SafetyMargin)
	var affected []*Lease
	for _, set := range []map[*Lease]struct{}{k.held, k.loose} {
		for l := range set {
			if l.status().state == leaseHeld && (!alive || l.sess != s) {
				affected = append(affected, l)
			}
		}
	}
	// Logged and counted before any holder is told, so that whoever wakes
	// on Done finds the step in the log and the metrics.
	c.log.Warn("pgbaton: database clock stepped forward", "session", s.id, "step", step, "leases_lost", len(affected),
		"error", fmt.Errorf("%w: %s", ErrClockStep, why))
	if c.tel != nil {
		c.tel.ClockStepped(context.Background())
	}
	for _, l := range affected {
		cause := fmt.Errorf("%w: %w: %q token %d: %s", ErrLeaseLost, ErrClockStep, l.name, l.token, why)
		// Only a lease still held: one released or handed off meanwhile
		// stays so.
		if old, ok := l.update(func(st *leaseStatus) bool { return st.state == leaseHeld && st.move(leaseLost, cause) }); ok {
			l.entered(leaseLost, old, cause, CauseClockStep)
		}
	}
}

// end ends s, once, as sessionDead or sessionClosed (its row deleted):
// every lease it carried is held by its own deadline from now, and lost at
// once if that passed.
func (k *keeper) end(s *session, to uint32, why string) {
	// Read before a keep-alive in flight is cancelled.
	trouble := s.trouble() && to == sessionDead
	if !s.state.CompareAndSwap(sessionAlive, to) {
		return
	}
	if s.stopKeep != nil {
		s.stopKeep()
	}
	var leases []*Lease
	if k.sess == s {
		k.sess = nil
		k.cur.CompareAndSwap(s, nil)
		leases = k.live()
		clear(k.held)
	}
	if to == sessionDead {
		k.c.log.Warn("pgbaton: lease session lost", "session", s.id, "leases", len(leases), "reason", why)
	} else {
		k.spawn(func() { k.c.closeSessionRow(k.c.bg, s) })
	}
	now := time.Now()
	for _, l := range leases {
		if st := l.status(); st.state == leaseHeld && !now.Before(st.own) {
			l.deadlinePassed(now, trouble)
		} else {
			k.loose[l] = struct{}{}
		}
	}
}

// closeSessionRow deletes s's row; leases still bound keep only their own
// expiry. Best effort: a session that is not closed expires at its TTL.
func (c *Client) closeSessionRow(ctx context.Context, s *session) error {
	ctx, cancel := c.cleanupContext(ctx)
	defer cancel()
	err := c.q.SessionClose(ctx, c.pool, s.id)
	if err != nil {
		c.log.Debug("pgbaton: closing lease session failed; it expires at its TTL", "session", s.id, "error", err)
	}
	return err
}

// findLost ends the leases of s that the database no longer has:
// force-released, or lost with the old primary (failedOver).
func (k *keeper) findLost(s *session, failedOver bool) {
	c := k.c
	leases := k.live()
	if len(leases) == 0 {
		return
	}
	names, tokens := grants(leases)
	k.spawn(func() {
		ctx, cancel := context.WithTimeout(c.bg, c.cfg.TTL)
		defer cancel()
		lost, err := c.q.SessionLost(ctx, c.pool, db.SessionLostParams{Session: s.id, Names: names, Tokens: tokens, Owner: c.cfg.Owner})
		if err != nil {
			c.log.Warn("pgbaton: checking for leases the database no longer has failed", "session", s.id, "error", err)
			k.post(func(k *keeper) { s.recheck = true })
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
	})
}

// afterKeepalive runs the hooks of leases that want to know of each
// successful keep-alive (job run heartbeats), in the background.
func (k *keeper) afterKeepalive() {
	c := k.c
	for _, l := range k.live() {
		if h := l.afterRenew.Load(); h != nil {
			k.spawn(func() {
				ctx, cancel := context.WithTimeout(c.bg, c.cfg.RenewInterval)
				defer cancel()
				(*h)(ctx)
			})
		}
	}
}
