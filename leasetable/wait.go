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
	"github.com/pgbaton/pgbaton/internal/listener"
	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// waiting is a waiter in the wait queue of a lease or group
// (pgbaton.lease_waiter): it looks again when notified by its id, which
// notify_waiters sends when its turn comes, or at a known expiry.
type waiting struct {
	c        *Client
	name, id string
	wake     chan struct{} // signalled by the listener (buffered, 1)
	// poll paces a waiter whose client holds no listen slot
	// (Config.ListenSlots) or whose LISTEN connection was not up in time:
	// nil for the others. lastToken is the grant it
	// last found in its way.
	poll      *backoff.Backoff
	lastToken int64
	// rank is the waiter's place among candidates (joinQueue), for a look
	// that queues it again after the database lost its registration.
	rank int32
	// lazy: a waiter for a lease whose client polls is registered by its
	// looks (lease_attempt with p_listens false), not by wait_for: no
	// release is to be ordered against a registration nobody notifies.
	// taken: a look granted it the lease, which removed its registration.
	lazy, taken bool
}

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
	look func(ctx context.Context, w *waiting) ([]*Lease, error)
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
func (c *Client) waitLoop(ctx context.Context, q want) (_ []*Lease, stillHeld bool, _ error) {
	var w *waiting
	defer func() {
		if w != nil {
			w.stop()
		}
	}()
	outage := backoff.Outage()
	for {
		got, err := q.look(ctx, w)
		if err == nil && len(got) > 0 {
			if w != nil {
				w.taken = true
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
		if retry, werr := c.waitOutage(ctx, &outage, err, q.kind, q.name); werr != nil {
			_, what := q.about()
			return nil, stillHeld, fmt.Errorf("leasetable: waiting %s: %w (last: %w)", what, werr, err)
		} else if retry {
			continue
		}
		if err != nil {
			return nil, false, err
		}
		outage.Reset()
		logged, what := q.about()
		if held != nil {
			c.log.Debug("pgbaton: waiting "+logged, q.kind, q.name, "holder", held.Holder, "grace", held.Grace, "lock_delay", held.LockDelay, "expires_in", held.remaining, "ahead", held.Ahead)
			w.heldBy(held.Token)
			d = w.atHead(held)
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
		if err := w.wait(ctx, d, q.woken); err != nil {
			return nil, true, fmt.Errorf("leasetable: waiting %s: %w", what, err)
		}
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
// again: until the first live item held by another owner expires, the
// TTL at most. With nothing live held by another owner (the group is
// free, held by the waiter's own client, or its items expired while an
// open transaction still locks their rows), only a notification would
// wake the waiter, and a LISTEN connection that died without a word is
// noticed late (a read that fails), so it looks again after a TTL;
// waiters that poll look again by PollInterval (Client.wait). During a
// failover grace, nothing can be granted before it ends, and the wait is
// until then: the grace ends then, or is turned off, which notifies every
// waiter. For ClaimUntilDrained it is ErrDrained once the group holds no
// item, after the completions in flight (pgbaton.group_drained).
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
	switch {
	case err != nil:
		return 0, c.dbError("next expiry in "+q.name, err)
	case next.GraceUntil != nil:
		return next.GraceUntil.Sub(next.DbNow), nil
	case next.NextExpiry == nil:
		return c.cfg.TTL, nil
	}
	return min(next.NextExpiry.Sub(next.DbNow), c.cfg.TTL), nil
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
func (c *Client) joinQueue(ctx context.Context, name string, group, drain bool, rank pgtype.Int4) (*waiting, error) {
	// The use of the session lasts until stop: the registration is bound
	// to it, so it is not closed idle while the waiter waits (that would
	// cost it its place in the queue).
	s, err := c.sessionFor(ctx)
	if err != nil {
		return nil, err
	}
	id := c.newID("")
	w := &waiting{c: c, name: name, id: id, wake: make(chan struct{}, 1), rank: rank.Int32}
	mode, err := c.ln.Subscribe(ctx, id, w.wake)
	if err != nil {
		c.k.unuse()
		return nil, err
	}
	switch {
	case mode == listener.PollingBackoff:
		w.poll = &backoff.Backoff{Min: backoff.SlotlessPoll, Max: c.cfg.PollInterval}
	case mode == listener.Polling && !c.cfg.NoListen:
		// Its connection did not deliver: it polls even once a new one
		// does, as nothing would notify its registration.
		w.poll = &backoff.Backoff{Min: c.cfg.PollInterval, Max: c.cfg.PollInterval}
	}
	if !group && mode != listener.Listening && rank.Valid && rank.Int32 == 0 {
		// Its next look registers it. Not an observer (never served) or a
		// preferred candidate (wait_for asks a leader it outranks to
		// resign).
		w.lazy = true
		return w, nil
	}
	p := db.LeaseWaitForParams{Name: name, Waiter: id, IsGroup: group, Session: s.Param(), TtlMs: c.ttlMs, Listens: mode == listener.Listening,
		Rank: rank, Drain: drain}
	if mode == listener.Listening {
		// Known to the listener first, so that a reconnection racing with
		// this registration makes it again.
		c.ln.Register(id, p)
	}
	_, err = inFlight(c, ctx, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, c.q.LeaseWaitFor(ctx, c.pool, p)
	}, func(context.Context, struct{}, error) {
		// Given up: the caller's stop below may run before the
		// registration commits, so it is removed again after it.
		c.ln.Leave(name, id)
	})
	if err != nil {
		// The registration may have committed although the call failed
		// (its reply was lost): remove it.
		w.stop()
		return nil, c.dbError("register waiter for "+name, err)
	}
	return w, nil
}

// param is the waiter's id for a look (lease_attempt, claim): nil for no
// waiter, which comes after every waiter of the queue.
func (w *waiting) param() pgtype.Text {
	if w == nil {
		return pgtype.Text{}
	}
	return pgtype.Text{String: w.id, Valid: true}
}

// polls tells a look that the waiter polls and registers by its looks.
func (w *waiting) polls() bool { return w != nil && w.lazy }

// rankParam is the waiter's rank for a look: 0 for no waiter.
func (w *waiting) rankParam() int32 {
	if w == nil {
		return 0
	}
	return w.rank
}

// stop unsubscribes and has the registration removed (Listener.Leave),
// not on the caller's goroutine, which goes on at once. The waiter's id is
// unique, so no later registration can be removed by it.
func (w *waiting) stop() {
	w.c.k.unuse()
	if w.taken {
		w.c.ln.Granted(w.name, w.id)
		return
	}
	w.c.ln.Leave(w.name, w.id)
}

// wait is Client.wait for this waiter (and woken, if not nil) for d, the
// time to a known expiry, at most its next poll when its client holds no
// listen slot.
func (w *waiting) wait(ctx context.Context, d time.Duration, woken <-chan struct{}) error {
	if w.poll != nil {
		d = min(d, w.poll.Next())
	}
	return w.c.wait(ctx, w.wake, woken, d)
}

// atHead is how long a waiter for a lease held as in held waits before
// it looks again: to the holder's expiry, but when nothing will wake it
// (it polls) and no failover grace or lock-delay holds the lease, at its
// place in the queue's pace (backoff.QueuePoll).
func (w *waiting) atHead(held *HeldError) time.Duration {
	if !held.Grace && !held.LockDelay && (w.poll != nil || w.c.ln.Polls()) {
		return backoff.QueuePoll(held.remaining, held.Ahead, w.c.cfg.PollInterval)
	}
	return held.remaining
}

// heldBy tells a waiter for a lease which grant it found in its way: a
// lease that changed hands since the last look is passed around quickly,
// so a waiter without a listen slot looks again soon rather than at its
// backed-off pace, which would leave it behind the waiters that are woken
// or look more often.
func (w *waiting) heldBy(token int64) {
	if w.poll != nil && token != w.lastToken {
		w.poll.Reset()
	}
	w.lastToken = token
}

// wait blocks until a wake-up (on wake or woken), until the known expiry
// (d from now, or PollInterval when notifications are not used) plus
// jitter (backoff.WaitFor), or until ctx or the client ends.
func (c *Client) wait(ctx context.Context, wake, woken <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(backoff.WaitFor(d, c.ln.Polls(), c.cfg.PollInterval, c.cfg.TTL))
	defer t.Stop()
	select {
	case <-wake:
		return nil
	case <-woken:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-c.bg.Done():
		return pgbaton.ErrClosed
	}
}

// waitOutage waits out err with backoff b when retrying can fix it (the
// server is down or failing over: a waiting call waits that out too, until
// ctx ends) and reports retry; any other err (or nil) it leaves to the
// caller. werr is why the wait ended early. attrs name what is waited for
// in the debug log.
func (c *Client) waitOutage(ctx context.Context, b *backoff.Backoff, err error, attrs ...any) (retry bool, werr error) {
	if f, _ := pgerr.Classify(ctx, err); err == nil || f == pgerr.Permanent {
		return false, nil
	}
	d := b.Next()
	c.log.Debug("pgbaton: looking again after a connection failure", append(attrs, "in", d, "error", err)...)
	return true, c.wait(ctx, nil, nil, d)
}
