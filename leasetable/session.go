package leasetable

import (
	"context"
	"fmt"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/inflight"
	"github.com/pgbaton/pgbaton/internal/leasestate"
	"github.com/pgbaton/pgbaton/internal/session"
	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// opening is a session being opened; done closes when s or err is set.
type opening struct {
	done chan struct{}
	s    *session.Session
	err  error
}

// sessionFor returns the session new grants bind to, having the keeper
// open one if needed, and counts the caller as a user of it until the
// caller's unuse: a session in use is not closed idle (keepalive), so a
// grant on its way is never bound to a session closed under it, which left
// its lease to its own expiry, lost a TTL later on a healthy client. A
// caller that gives up returns at once; the session is opened all the
// same.
func (c *Client) sessionFor(ctx context.Context) (*session.Session, error) {
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
	if !k.Post(func(k *keeper) { k.using.Add(-1) }) {
		k.using.Add(-1)
	}
}

// takeSession is sessionFor without the count.
func (c *Client) takeSession(ctx context.Context) (*session.Session, error) {
	if s := c.k.cur.Load(); s != nil && s.Carries(time.Now()) && !s.Closing.Load() {
		return s, nil
	}
	got := make(chan *opening, 1)
	if !c.k.Post(func(k *keeper) { got <- k.open() }) {
		return nil, pgbaton.ErrClosed
	}
	op := <-got
	select {
	case <-op.done:
		return op.s, op.err
	case <-ctx.Done():
		return nil, inflight.CtxErr(ctx)
	}
}

// open returns the current session if it carries leases, else the one
// being opened, opening one if none is.
func (k *keeper) open() *opening {
	now := time.Now()
	if s := k.sess; s != nil && s.Carries(now) {
		op := &opening{done: make(chan struct{}), s: s}
		close(op.done)
		return op
	}
	if s := k.sess; s != nil {
		k.end(s, session.Dead, "no successful keep-alive before the local deadline")
	}
	if k.opening != nil {
		return k.opening
	}
	c := k.c
	op := &opening{done: make(chan struct{})}
	k.opening = op
	if k.Spawn(func() {
		// Bounded by the TTL: a later reply is of no use.
		ctx, cancel := context.WithTimeout(c.bg, c.cfg.TTL)
		defer cancel()
		s, err := c.openSession(ctx)
		if k.Post(func(k *keeper) { k.opened(op, s, err) }) {
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
func (k *keeper) opened(op *opening, s *session.Session, err error) {
	k.opening = nil
	if err == nil {
		k.sess = s
		k.cur.Store(s)
		s.KeepAt = s.RenewedAt.Add(k.c.cfg.RenewInterval)
		k.c.log.Debug("pgbaton: lease session opened", "session", s.ID)
	}
	op.s, op.err = s, err
	close(op.done)
}

// openSession opens a lease session.
func (c *Client) openSession(ctx context.Context) (*session.Session, error) {
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
	return session.New(row.ID, row.Epoch, start, row.ExpiresAt, time.Duration(c.ttlMs)*time.Millisecond, c.cfg.TTL-c.cfg.SafetyMargin), nil
}

// keepalive sends s's keep-alive, or closes s when it has carried no lease
// and had no waiter for a TTL.
func (k *keeper) keepalive(s *session.Session, now time.Time) {
	c := k.c
	n := len(k.live())
	if s.Idle(n > 0 || k.inUse(), now, c.cfg.TTL) {
		// Let it go rather than write for nothing; the next grant opens a
		// new session. Closing first, then the uses: a grant counts its
		// use first, then reads Closing (sessionFor), so one of the two
		// sees the other (atomics are sequentially consistent) and no
		// grant takes a session closed under it.
		s.Closing.Store(true)
		if !k.inUse() {
			k.end(s, session.Closed, "idle")
			return
		}
		s.Closing.Store(false)
		s.IdleSince = time.Time{}
	}
	ctx, cancel := context.WithDeadline(c.bg, s.Until())
	s.Keeping, s.StopKeep = true, cancel
	s.Inflight.Store(true)
	if !k.Spawn(func() {
		defer cancel()
		session.AwaitIdleConn(ctx, c.pool, c.cfg.RenewInterval, s.Until())
		start := time.Now()
		ctx, span := c.tr.Start(ctx, spanKeepalive, "lease")
		var row db.SessionKeepaliveRow
		err := c.retry(ctx, true, func(ctx context.Context) (err error) {
			row, err = c.q.SessionKeepalive(ctx, c.pool, db.SessionKeepaliveParams{ID: s.ID, TtlMs: c.ttlMs})
			return err
		})
		replied := time.Now()
		telemetry.EndKeepalive(span, c.cfg.Owner, s.ID, n, row.Alive, err)
		if err != nil {
			s.Failing.Store(true) // before Inflight clears: Trouble() never blinks
		} else if row.Alive {
			s.Extend(start, row.ExpiresAt, c.cfg.TTL-c.cfg.SafetyMargin)
		}
		s.Inflight.Store(false)
		k.Post(func(k *keeper) { k.keptAlive(s, n, start, replied, row, err) })
	}) {
		cancel()
		s.Keeping, s.StopKeep = false, nil
		s.Inflight.Store(false)
	}
}

// inUse reports whether the session is in use without a lease: a waiter
// is queued on it, a grant is on its way (sessionFor), or grants are to be
// given back by request id, which finds them by their session.
func (k *keeper) inUse() bool {
	return k.using.Load() > 0 || k.back.RefsPending()
}

// keptAlive handles the reply to s's keep-alive, sent at start for n
// leases and answered at replied.
func (k *keeper) keptAlive(s *session.Session, n int, start, replied time.Time, row db.SessionKeepaliveRow, err error) {
	c := k.c
	s.Keeping, s.StopKeep = false, nil
	if err != nil && s.State.Load() != session.Closed {
		// Failed, or hung until the deadline; not stopped by Close.
		c.tel.RenewFailed(context.Background(), "", err)
	}
	if s.State.Load() != session.Alive {
		return
	}
	var step time.Duration
	if err == nil {
		step = s.ClockStep(start, replied, row.ServerNow)
	}
	switch {
	case err == nil && row.Alive:
		if s.Failing.Swap(false) {
			c.log.Info("pgbaton: lease keep-alive succeeded again", "session", s.ID)
		}
		if start.After(s.RenewedAt) {
			s.RenewedAt = start
		}
		look, failedOver := s.Kept(row.Revoked, row.Epoch)
		s.KeepAt = time.Now().Add(c.cfg.RenewInterval)
		if step > c.cfg.SafetyMargin {
			k.clockStepped(s, true, step)
		}
		if look {
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
		k.end(s, session.Dead, "the database no longer has the lease session")
	default:
		s.Failing.Store(true)
		retry := max(c.cfg.RenewInterval/keepaliveRetries, time.Millisecond)
		c.log.Warn("pgbaton: lease keep-alive failed; retrying", "session", s.ID, "leases", n,
			"retry_in", retry, "until", time.Until(s.Until()), "error", err)
		s.KeepAt = time.Now().Add(retry)
	}
}

// keepaliveRetries: a failing keep-alive is retried this many times per
// RenewInterval, so several tries fit before the deadline.
const keepaliveRetries = 5

// clockStepped handles a forward step of the database's clock by more
// than the safety margin, seen by a keep-alive of s: every lease held is
// lost now (the database may have let it go), except those s carries when
// alive (the keep-alive found s unexpired and extended it).
func (k *keeper) clockStepped(s *session.Session, alive bool, step time.Duration) {
	c := k.c
	why := fmt.Sprintf("the database's clock moved %s further than this client's since the previous keep-alive, more than the safety margin %s",
		step.Round(time.Millisecond), c.cfg.SafetyMargin)
	var affected []*Lease
	for _, set := range []map[*Lease]struct{}{k.held, k.loose} {
		for l := range set {
			if l.st.Load().State == leasestate.Held && (!alive || l.sess != s) {
				affected = append(affected, l)
			}
		}
	}
	// Logged and counted before any holder is told, so that whoever wakes
	// on Done finds the step in the log and the metrics.
	c.log.Warn("pgbaton: database clock stepped forward", "session", s.ID, "step", step, "leases_lost", len(affected),
		"error", fmt.Errorf("%w: %s", ErrClockStep, why))
	c.tel.ClockStepped(context.Background())
	for _, l := range affected {
		cause := fmt.Errorf("%w: %w: %q token %d: %s", ErrLeaseLost, ErrClockStep, l.name, l.token, why)
		// Only a lease still held: one released or handed off meanwhile
		// stays so.
		if old, ok := l.st.Update(func(st *leasestate.Status) bool {
			return st.State == leasestate.Held && st.Move(leasestate.Lost, cause)
		}); ok {
			l.entered(leasestate.Lost, old, cause, CauseClockStep)
		}
	}
}

// end ends s, once, as session.Dead or session.Closed (its row deleted):
// every lease it carried is held by its own deadline from now, and lost at
// once if that passed.
func (k *keeper) end(s *session.Session, to uint32, why string) {
	// Read before a keep-alive in flight is cancelled.
	trouble := s.Trouble() && to == session.Dead
	if !s.State.CompareAndSwap(session.Alive, to) {
		return
	}
	if s.StopKeep != nil {
		s.StopKeep()
	}
	var leases []*Lease
	if k.sess == s {
		k.sess = nil
		k.cur.CompareAndSwap(s, nil)
		leases = k.live()
		clear(k.held)
	}
	if to == session.Dead {
		k.c.log.Warn("pgbaton: lease session lost", "session", s.ID, "leases", len(leases), "reason", why)
	} else {
		k.Spawn(func() { k.c.closeSessionRow(k.c.bg, s) })
	}
	now := time.Now()
	for _, l := range leases {
		if st := l.st.Load(); st.State == leasestate.Held && !now.Before(st.Own) {
			l.deadlinePassed(now, trouble)
		} else {
			k.loose[l] = struct{}{}
		}
	}
}

// closeSessionRow deletes s's row; leases still bound keep only their own
// expiry. Best effort: a session that is not closed expires at its TTL.
func (c *Client) closeSessionRow(ctx context.Context, s *session.Session) error {
	ctx, cancel := c.cleanupContext(ctx)
	defer cancel()
	err := c.q.SessionClose(ctx, c.pool, s.ID)
	if err != nil {
		c.log.Debug("pgbaton: closing lease session failed; it expires at its TTL", "session", s.ID, "error", err)
	}
	return err
}

// findLost ends the leases of s that the database no longer has:
// force-released, or lost with the old primary (failedOver).
func (k *keeper) findLost(s *session.Session, failedOver bool) {
	c := k.c
	leases := k.live()
	if len(leases) == 0 {
		return
	}
	names, tokens := grants(leases)
	k.Spawn(func() {
		ctx, cancel := context.WithTimeout(c.bg, c.cfg.TTL)
		defer cancel()
		lost, err := c.q.SessionLost(ctx, c.pool, db.SessionLostParams{Session: s.ID, Names: names, Tokens: tokens, Owner: c.cfg.Owner})
		if err != nil {
			c.log.Warn("pgbaton: checking for leases the database no longer has failed", "session", s.ID, "error", err)
			k.Post(func(k *keeper) { s.Recheck = true })
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
			k.Spawn(func() {
				ctx, cancel := context.WithTimeout(c.bg, c.cfg.RenewInterval)
				defer cancel()
				(*h)(ctx)
			})
		}
	}
}
