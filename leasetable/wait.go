package leasetable

import (
	"context"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/backoff"
	"github.com/pgbaton/pgbaton/internal/db"
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
}

// startWaiting joins the wait queue of lease name, or of group name when
// group is set: subscribed to notifications for its id first, then
// registered, so that by the time a release can see the registration the
// LISTEN is active. Waiters that poll (NoListen, no listen slot, a pooler)
// queue the same way: their place is kept, and they find out at their next
// look that their turn came. The registration is bound to the client's
// session, so a waiter whose process dies leaves the queue with it.
func (c *Client) startWaiting(ctx context.Context, name string, group, drain bool) (*waiting, error) {
	return c.joinQueue(ctx, name, group, drain, pgtype.Int4{Valid: true})
}

// joinQueue is startWaiting with a rank: a candidate of an election ranks
// by its preference, and a NULL rank registers an observer, woken by new
// terms and requests to resign instead of by its turn (election.go).
func (c *Client) joinQueue(ctx context.Context, name string, group, drain bool, rank pgtype.Int4) (*waiting, error) {
	s, err := c.sessionFor(ctx)
	if err != nil {
		return nil, err
	}
	id := c.waiterPrefix + strconv.FormatInt(c.waiterSeq.Add(1), 10)
	w := &waiting{c: c, name: name, id: id, wake: make(chan struct{}, 1), rank: rank.Int32}
	mode, err := c.ln.subscribe(ctx, id, w.wake)
	if err != nil {
		return nil, err
	}
	c.k.waiters.Add(1) // until stop: the session is in use
	if mode == pollingBackoff {
		w.poll = &backoff.Backoff{Min: slotlessPoll, Max: c.cfg.PollInterval}
	}
	p := db.LeaseWaitForParams{Name: name, Waiter: id, IsGroup: group, Session: s.param(), TtlMs: c.ttlMs, Listens: mode == listening,
		Rank: rank, Drain: drain}
	if mode == listening {
		// Known to the listener first, so that a reconnection racing with
		// this registration makes it again.
		c.ln.register(id, p)
	}
	_, err = inFlight(c, ctx, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, c.q.LeaseWaitFor(ctx, c.pool, p)
	}, func(context.Context, struct{}, error) {
		// Given up: the caller's stop below may run before the
		// registration commits, so it is removed again after it.
		c.ln.leave(name, id)
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

// rankParam is the waiter's rank for a look: 0 for no waiter.
func (w *waiting) rankParam() int32 {
	if w == nil {
		return 0
	}
	return w.rank
}

// stop unsubscribes and has the registration removed (listener.leave),
// not on the caller's goroutine, which goes on at once. The waiter's id is
// unique, so no later registration can be removed by it.
func (w *waiting) stop() {
	w.c.k.waiters.Add(-1)
	w.c.ln.leave(w.name, w.id)
}

// slotlessPoll is how soon a waiter of a client without a listen slot
// looks again the first time; the delay doubles up to PollInterval. A
// lease held briefly, the common case in a fleet, is found free within
// tens of milliseconds; a waiter behind a long hold settles at one look
// per PollInterval.
const slotlessPoll = 50 * time.Millisecond

// wait is Client.wait for this waiter, paced by poll when its client holds
// no listen slot.
func (w *waiting) wait(ctx context.Context, d time.Duration) error {
	return w.c.wait(ctx, w.wake, w.paced(d))
}

// paced is d, the time to a known expiry, at most the waiter's next poll
// when its client holds no listen slot.
func (w *waiting) paced(d time.Duration) time.Duration {
	if w.poll != nil {
		d = min(d, w.poll.Next())
	}
	return d
}

// atHead is how long a waiter for a lease held as in held waits before
// it looks again: to the holder's expiry, but when nothing will wake it
// (it polls), no longer than headPoll times its place in the queue. Only
// the head of the queue can be granted a lease that is freed, so the head
// looks often and those behind it less and less often: a queue of pollers
// costs the server about what two pollers at headPoll do, and a freed
// lease does not wait a whole PollInterval for its next holder (a fleet of
// 500 NoListen clients, 10 per name, PollInterval 100ms: 646 calls/s
// before the queue, 286 with it and every poller at PollInterval).
func (w *waiting) atHead(held *HeldError) time.Duration {
	d := held.remaining
	if !held.Grace && !held.LockDelay && (w.poll != nil || w.c.ln.polling()) {
		d = min(d, headPoll(w.c.cfg.PollInterval)*time.Duration(held.Ahead+1))
	}
	return d
}

// headPoll is how often a polling waiter at the head of its queue looks
// again: a tenth of PollInterval, between 5 and 50ms.
func headPoll(pollInterval time.Duration) time.Duration {
	return min(max(pollInterval/10, 5*time.Millisecond), 50*time.Millisecond)
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

// wait blocks until a wake-up, until the known expiry (d from now, or
// PollInterval when notifications are not used) plus jitter, or until ctx
// or the client ends.
func (c *Client) wait(ctx context.Context, wake <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(c.waitFor(d))
	defer t.Stop()
	select {
	case <-wake:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-c.bg.Done():
		return pgbaton.ErrClosed
	}
}

// waitFor is how long a wait for d (the time to a known expiry) lasts
// before its waiter looks again: d plus jitter, and PollInterval at most
// when no notification will come (or none while the LISTEN connection is
// down and reconnected: it is not ready then, so mode says so).
func (c *Client) waitFor(d time.Duration) time.Duration {
	if c.ln.polling() {
		d = min(d, c.cfg.PollInterval)
	}
	return max(d, 0) + jitter(c.cfg.TTL)
}

// outageBackoff paces a waiter looking again while the server is down or
// failing over.
func outageBackoff() backoff.Backoff {
	return backoff.Backoff{Min: 50 * time.Millisecond, Max: 250 * time.Millisecond}
}

// waitOutage waits out err with backoff b when retrying can fix it (the
// server is down or failing over: a waiting call waits that out too, until
// ctx ends) and reports retry; any other err (or nil) it leaves to the
// caller. werr is why the wait ended early. attrs name what is waited for
// in the debug log.
func (c *Client) waitOutage(ctx context.Context, b *backoff.Backoff, err error, attrs ...any) (retry bool, werr error) {
	if f, _ := classify(ctx, err); err == nil || f == permanentFailure {
		return false, nil
	}
	d := b.Next()
	c.log.Debug("pgbaton: looking again after a connection failure", append(attrs, "in", d, "error", err)...)
	return true, c.wait(ctx, nil, d)
}

// jitter spreads waiters that look again at the same expiry: up to 1% of
// the TTL, at least 1ms and at most 20ms.
func jitter(ttl time.Duration) time.Duration {
	hi := min(max(ttl/100, time.Millisecond), 20*time.Millisecond)
	return time.Millisecond + rand.N(hi)
}
