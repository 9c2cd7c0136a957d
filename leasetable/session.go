package leasetable

import (
	"context"
	"fmt"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/inflight"
	"github.com/pgbaton/pgbaton/internal/leasestate"
	"github.com/pgbaton/pgbaton/internal/pgerr"
	"github.com/pgbaton/pgbaton/internal/session"
	"github.com/pgbaton/pgbaton/internal/telemetry"
)

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
	s.Use()
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
	got := make(chan *session.Opening, 1)
	if !c.k.Post(func(k *keeper) { got <- k.open() }) {
		return nil, pgbaton.ErrClosed
	}
	op := <-got
	select {
	case <-op.Done():
		return op.Result()
	case <-ctx.Done():
		return nil, inflight.CtxErr(ctx)
	}
}

// open returns the current session if it carries leases, else the one
// being opened, opening one if none is.
func (k *keeper) open() *session.Opening {
	now := time.Now()
	if s := k.sess; s != nil && s.Carries(now) {
		return session.Opened(s)
	}
	if s := k.sess; s != nil {
		k.end(s, session.Dead, "no successful keep-alive before the local deadline")
	}
	if k.opening != nil {
		return k.opening
	}
	c := k.c
	op := session.NewOpening()
	k.opening = op
	if k.Spawn(func() {
		// Bounded by the TTL: a later reply is of no use. An opening cut
		// there is marked ErrSlow, so that a wait opens again as it looks
		// again after a look cut at the TTL, rather than ending on a busy
		// server; if it committed after all, the row holds no grant and
		// expires a TTL later.
		ctx, cancel := context.WithTimeout(c.bg, c.cfg.TTL)
		defer cancel()
		s, err := c.sdb.Open(ctx)
		if err != nil {
			err = c.dbError("open lease session", pgerr.Bounded(ctx, c.cfg.TTL, err))
		}
		if k.Post(func(k *keeper) { k.opened(op, s, err) }) {
			return
		}
		if s != nil {
			c.closeSessionRow(context.Background(), s)
			err = errClosedDuringOpen
		}
		op.Finish(nil, err)
	}) {
		return op
	}
	k.opening = nil
	op.Finish(nil, pgbaton.ErrClosed)
	return op
}

var errClosedDuringOpen = fmt.Errorf("%w: the client closed while a lease session was opened", pgbaton.ErrClosed)

// opened makes s, just opened, the session new grants bind to.
func (k *keeper) opened(op *session.Opening, s *session.Session, err error) {
	k.opening = nil
	if err == nil {
		k.sess = s
		k.cur.Store(s)
		s.KeepAt = s.RenewedAt.Add(k.c.cfg.RenewInterval)
		k.c.log.Debug("pgbaton: lease session opened", "session", s.ID)
	}
	op.Finish(s, err)
}

// keepalive sends s's keep-alive, or closes s when it has carried no lease
// and had no waiter for a TTL.
func (k *keeper) keepalive(s *session.Session, now time.Time) {
	c := k.c
	n := len(k.leases.Live())
	// A grant counts its use (sessionFor) before it reads Closing.
	if s.CloseIdle(n > 0, k.inUse, now, c.cfg.TTL) {
		k.end(s, session.Closed, "idle")
		return
	}
	ctx, cancel := context.WithDeadline(c.bg, s.Until())
	s.Sending(cancel)
	if !k.Spawn(func() {
		defer cancel()
		s.AwaitIdleConn(ctx, c.pool, c.cfg.RenewInterval)
		ctx, span := c.tr.Start(ctx, spanKeepalive, "lease")
		r := c.sdb.Keepalive(ctx, s)
		telemetry.EndKeepalive(span, c.cfg.Owner, s.ID, n, r.Alive, r.Err)
		s.Answered(r, c.sdb.Local)
		k.Post(func(k *keeper) { k.keptAlive(s, n, r) })
	}) {
		cancel()
		s.Unsent()
	}
}

// inUse reports whether the session is in use without a lease: a waiter
// is queued on it, a grant is on its way (sessionFor), or grants are to be
// given back by request id, which finds them by their session.
func (k *keeper) inUse() bool {
	return k.using.Load() > 0 || k.back.RefsPending()
}

// keptAlive handles the reply r to s's keep-alive, sent for n leases.
func (k *keeper) keptAlive(s *session.Session, n int, r session.Reply) {
	c := k.c
	v := s.Read(r, time.Now(), c.cfg.RenewInterval, c.cfg.SafetyMargin)
	if v.Failed {
		c.tel.RenewFailed(context.Background(), "", r.Err)
	}
	switch v.Outcome {
	case session.Kept:
		if v.Recovered {
			c.log.Info("pgbaton: lease keep-alive succeeded again", "session", s.ID)
		}
		if v.Step > 0 {
			k.clockStepped(s, true, v.Step)
		}
		if v.Look {
			k.findLost(s, v.FailedOver)
		}
		k.sendBack()
		k.c.ln.RetryLeaving()
		k.afterKeepalive()
	case session.Gone:
		// Its leases are valid by their own expiry only — and not even
		// that when the database's clock stepped past it.
		if v.Step > 0 {
			k.clockStepped(s, false, v.Step)
		}
		k.end(s, session.Dead, "the database no longer has the lease session")
	case session.Retry:
		c.log.Warn("pgbaton: lease keep-alive failed; retrying", "session", s.ID, "leases", n,
			"retry_in", v.RetryIn, "until", time.Until(s.Until()), "error", r.Err)
	}
}

// clockStepped handles a forward step of the database's clock by more
// than the safety margin, seen by a keep-alive of s: every lease held is
// lost now (the database may have let it go), except those s carries when
// alive (the keep-alive found s unexpired and extended it).
func (k *keeper) clockStepped(s *session.Session, alive bool, step time.Duration) {
	c := k.c
	why := session.StepWhy(step, c.cfg.SafetyMargin)
	var affected []*Lease
	for l := range k.leases.All() {
		if l.st.Load().State == leasestate.Held && (!alive || l.sess != s) {
			affected = append(affected, l)
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
	trouble, ok := s.End(to)
	if !ok {
		return
	}
	now := time.Now()
	var n int
	var passed []*Lease
	if k.sess == s {
		k.sess = nil
		k.cur.CompareAndSwap(s, nil)
		n, passed = k.leases.Loosen(now)
	}
	if to == session.Dead {
		k.c.log.Warn("pgbaton: lease session lost", "session", s.ID, "leases", n, "reason", why)
	} else {
		k.Spawn(func() { k.c.closeSessionRow(k.c.bg, s) })
	}
	for _, l := range passed {
		l.deadlinePassed(now, trouble)
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
	leases := k.leases.Live()
	if len(leases) == 0 {
		return
	}
	names, tokens := grants(leases)
	k.Spawn(func() {
		ctx, cancel := context.WithTimeout(c.bg, c.cfg.TTL)
		defer cancel()
		gone, err := c.sdb.Lost(ctx, s, names, tokens)
		if err != nil {
			c.log.Warn("pgbaton: checking for leases the database no longer has failed", "session", s.ID, "error", err)
			k.Post(func(k *keeper) { s.Recheck = true })
			return
		}
		why := session.LostWhy(failedOver)
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
	for _, l := range k.leases.Live() {
		if h := l.afterRenew.Load(); h != nil {
			k.Spawn(func() {
				ctx, cancel := context.WithTimeout(c.bg, c.cfg.RenewInterval)
				defer cancel()
				(*h)(ctx)
			})
		}
	}
}
