package leasetable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/backoff"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/inflight"
	"github.com/pgbaton/pgbaton/internal/listener"
)

// A want is what a waiting call waits for (Client.waitLoop): lease name
// (kind "lease"), or items (kind "group") or a permit (kind "semaphore")
// of group name. kind and name are the attributes of its debug lines.
type want struct {
	kind, name string
	rank       int32 // the place among candidates (an election's preference)
	drain      bool  // ClaimUntilDrained: ends with ErrDrained, completions wake it
	// look looks once, as waiter w of the queue (nil before it joined): it
	// returns what it granted, or nothing, with a *HeldError when a lease
	// is held.
	look func(ctx context.Context, w *listener.Waiter) ([]*Lease, error)
	// woken wakes the wait besides the queue (Keep: one of its leases
	// ended); nil for the others.
	woken <-chan struct{}
}

// waitLoop is the wait of every waiting call: it looks; when nothing was
// granted it joins the queue the first time and looks again at once (what
// was freed before the registration notified nobody), else waits for its
// turn or a known expiry, and looks again. It waits out a server that
// cannot be reached, with backoff, until ctx ends. It returns what a look
// granted, or the error that ended the wait: ctx's and Close's wrapped
// with what was waited for, a look's as it is. stillHeld tells a wait
// that ctx or Close ended after a look found nothing for it (contention,
// for waitEnded).
//
// When ctx has a deadline, the wait leaves the queue itself just before
// it (listener.LeaveMargin) and sends no look after that: a look still in
// flight at the deadline is abandoned, its connection stays busy until it
// returns, and what it granted is given back; and a removal sent after the
// call returned runs beside the caller's next call. Either made the caller's
// next statement open a second connection of the pool.
func (c *Client) waitLoop(ctx context.Context, q want) (_ []*Lease, stillHeld bool, _ error) {
	var w *listener.Waiter
	defer func() {
		if w != nil {
			c.stopWaiting(w)
		}
	}()
	outage := backoff.Outage()
	deadline, hasDeadline := ctx.Deadline()
	budget := time.Until(deadline)
	var lastLook time.Duration // how long this wait's last look took
	_, what := q.about()       // for its error: what it waits for, held by whom
	for {
		// When the wait leaves the queue (none without a deadline).
		var leaveAt time.Time
		if hasDeadline {
			leaveAt = deadline.Add(-listener.LeaveMargin(lastLook, budget))
		}
		if w != nil && !leaveAt.IsZero() && !time.Now().Before(leaveAt) {
			return nil, stillHeld, fmt.Errorf("leasetable: waiting %s: %w", what, c.leaveBeforeDeadline(ctx, w))
		}
		start := time.Now()
		done := c.k.cur.Load().Look(ctx, c.pool)
		got, err := q.look(ctx, w)
		done()
		lastLook = time.Since(start)
		if err == nil && len(got) > 0 {
			if w != nil {
				w.Removed = true
			}
			return got, false, nil
		}
		var held *HeldError
		var d time.Duration
		if err == nil || errors.As(err, &held) {
			stillHeld = true
			switch {
			case w == nil:
				if w, err = c.joinQueue(ctx, q.name, q.kind != "lease", q.drain, pgtype.Int4{Int32: q.rank, Valid: true}); err == nil {
					continue
				}
			case held != nil:
				err = nil
			default:
				d, err = c.groupWait(ctx, q)
			}
		}
		if retry, werr := c.ln.WaitOutage(ctx, &outage, err, q.kind, q.name); werr != nil {
			return nil, stillHeld, fmt.Errorf("leasetable: waiting %s: %w (last: %w)", what, werr, err)
		} else if retry {
			continue
		}
		if err != nil {
			return nil, false, err
		}
		outage.Reset()
		logged, plain := q.about()
		what = plain
		if held != nil {
			c.log.Debug("pgbaton: waiting "+logged, q.kind, q.name, "holder", held.Holder, "grace", held.Grace, "lock_delay", held.LockDelay, "expires_in", held.remaining, "ahead", held.Ahead)
			w.HeldBy(held.Token)
			d = w.AtHead(held.remaining, held.Ahead, held.Grace || held.LockDelay)
			switch {
			case held.Grace:
				what += " (failover grace)"
			case held.LockDelay:
				what += fmt.Sprintf(" (lock-delay after %q lost it)", held.Holder)
			default:
				what += fmt.Sprintf(" (held by %q)", held.Holder)
			}
		} else {
			c.log.Debug("pgbaton: waiting "+logged, q.kind, q.name, "expiry_in", d)
		}
		if err := w.WaitUntil(ctx, d, q.woken, leaveAt); err != nil {
			return nil, true, fmt.Errorf("leasetable: waiting %s: %w", what, err)
		}
	}
}

// leaveBeforeDeadline ends a wait whose deadline is nearer than a look
// would take (waitLoop): it removes waiter w's registration on the
// caller's goroutine while ctx runs, then waits for ctx (or Close) to end,
// and returns why it ended. A removal still on its way at the deadline
// goes on, and only if it fails is the registration removed in the
// background (Listener.Leave); one that failed before is left to
// stopWaiting. Sending a second removal beside the first one doubled the
// removals of a loaded fleet: 443 waits left before their deadline, and
// 341 background removals besides.
func (c *Client) leaveBeforeDeadline(ctx context.Context, w *listener.Waiter) error {
	_, gaveUp, err := inflight.Send(ctx, c.k, c.cfg.TTL, c.cfg.ReleaseTimeout, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, w.LeaveNow(ctx, c.pool)
	}, func(_ context.Context, _ struct{}, err error) {
		if err != nil {
			c.ln.Leave(w.Name, w.ID)
		}
	})
	if err == nil || gaveUp {
		w.Removed = true
	}
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-c.bg.Done():
		return pgbaton.ErrClosed
	}
}

// about is what q waits for: in its debug line, which tests and the
// benchmarks look for, and in its errors.
func (q want) about() (logged, what string) {
	switch q.kind {
	case "lease":
		return "for lease", fmt.Sprintf("for lease %q", q.name)
	case "semaphore":
		return "for semaphore", fmt.Sprintf("for semaphore %q", q.name)
	}
	return "to claim", fmt.Sprintf("to claim from %q", q.name)
}

// groupWait is how long a waiter of group q.name waits before it looks
// again (listener.GroupWait). For ClaimUntilDrained it is ErrDrained once
// the group holds no item, after the completions in flight
// (pgbaton.group_drained).
func (c *Client) groupWait(ctx context.Context, q want) (time.Duration, error) {
	if q.drain {
		drained, err := inFlight(c, ctx, func(ctx context.Context) (bool, error) {
			return c.q.LeaseGroupDrained(ctx, c.pool, q.name)
		}, nil)
		if err != nil {
			return 0, c.dbError("drained "+q.name, err)
		}
		if drained {
			return 0, fmt.Errorf("%w: %q", ErrDrained, q.name)
		}
	}
	next, err := inFlight(c, ctx, func(ctx context.Context) (db.LeaseGroupNextExpiryRow, error) {
		return c.q.LeaseGroupNextExpiry(ctx, c.pool, db.LeaseGroupNextExpiryParams{LeaseGroup: q.name, Owner: c.cfg.Owner})
	}, nil)
	if err != nil {
		return 0, c.dbError("next expiry in "+q.name, err)
	}
	return listener.GroupWait(next, c.cfg.TTL), nil
}

// joinQueue joins the wait queue of lease name, or of group name when
// group is set: subscribed to notifications for its id first, then
// registered, so that by the time a release can see the registration the
// LISTEN is active. Waiters that poll (NoListen, no listen slot, a pooler)
// queue the same way: their place is kept, and they find out at their next
// look that their turn came. The registration is bound to the client's
// session, so a waiter whose process dies leaves the queue with it. A
// candidate of an election ranks by its preference (0 for every other
// waiter), and a NULL rank registers an observer, woken by new terms and
// requests to resign instead of by its turn (election.go).
func (c *Client) joinQueue(ctx context.Context, name string, group, drain bool, rank pgtype.Int4) (*listener.Waiter, error) {
	// The use of the session lasts until stopWaiting: the registration is
	// bound to it, so it is not closed idle while the waiter waits (that
	// would cost it its place in the queue).
	s, err := c.sessionFor(ctx)
	if err != nil {
		return nil, err
	}
	w, mode, err := c.ln.Join(ctx, name, group, rank)
	if err != nil {
		c.k.unuse()
		return nil, err
	}
	if w.Polls() {
		return w, nil // its next look registers it
	}
	p := db.LeaseWaitForParams{Name: name, Waiter: w.ID, IsGroup: group, Session: s.Param(), TtlMs: c.ttlMs, Listens: mode == listener.Listening,
		Rank: rank, Drain: drain}
	if mode == listener.Listening {
		// Known to the listener first, so that a reconnection racing with
		// this registration makes it again.
		c.ln.Register(w.ID, p)
	}
	_, err = inFlight(c, ctx, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, c.q.LeaseWaitFor(ctx, c.pool, p)
	}, func(context.Context, struct{}, error) {
		// Given up: the caller's stopWaiting below may run before the
		// registration commits, so it is removed again after it.
		c.ln.Leave(name, w.ID)
	})
	if err != nil {
		// The registration may have committed although the call failed
		// (its reply was lost): remove it.
		c.stopWaiting(w)
		return nil, c.dbError("register waiter for "+name, err)
	}
	return w, nil
}

// stopWaiting ends waiter w (listener.Waiter.Stop) and its use of the
// session (joinQueue).
func (c *Client) stopWaiting(w *listener.Waiter) {
	c.k.unuse()
	w.Stop()
}
