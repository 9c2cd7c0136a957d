package listener

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/backoff"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// Waiter is a waiter in the wait queue of a lease or group
// (pgbaton.lease_waiter): it looks again when notified by its id, which
// notify_waiters sends when its turn comes, or at a known expiry. Its
// registration is the caller's, made once Join returned, so that the
// waiter listens before a release can see it.
type Waiter struct {
	ln       *Listener
	Name, ID string
	wake     chan struct{} // signalled by the listener (buffered, 1)
	// poll paces a waiter whose client holds no listen slot
	// (Config.ListenSlots) or whose LISTEN connection was not up in time:
	// nil for the others. lastToken is the grant it
	// last found in its way.
	poll      *backoff.Backoff
	lastToken int64
	// rank is the waiter's place among candidates (Join), for a look
	// that queues it again after the database lost its registration.
	rank int32
	// lazy: a waiter for a lease whose client polls is registered by its
	// looks (lease_attempt with p_listens false), not by wait_for: no
	// release is to be ordered against a registration nobody notifies.
	lazy bool
	// Removed: a statement of the wait removed its registration (a look
	// that granted it the lease, or LeaveNow), so Stop sends none.
	Removed bool
}

// Join subscribes a new waiter of the queue of lease name, or of group
// name when group is set, to notifications for its id, and decides from
// mode how it is paced and whether its looks register it. rank is the
// one it registers with (NULL: an observer).
func (ln *Listener) Join(ctx context.Context, name string, group bool, rank pgtype.Int4) (*Waiter, Mode, error) {
	w := &Waiter{ln: ln, Name: name, ID: ln.cfg.NewID(""), wake: make(chan struct{}, 1), rank: rank.Int32}
	mode, err := ln.subscribe(ctx, w.ID, w.wake)
	if err != nil {
		return nil, 0, err
	}
	switch {
	case mode == PollingBackoff:
		w.poll = &backoff.Backoff{Min: backoff.SlotlessPoll, Max: ln.cfg.PollInterval}
	case mode == Polling && !ln.cfg.NoListen:
		// Its connection did not deliver: it polls even once a new one
		// does, as nothing would notify its registration.
		w.poll = &backoff.Backoff{Min: ln.cfg.PollInterval, Max: ln.cfg.PollInterval}
	}
	// Its next look registers it (Polls). Not an observer (never served)
	// or a preferred candidate (wait_for asks a leader it outranks to
	// resign).
	w.lazy = !group && mode != Listening && rank.Valid && rank.Int32 == 0
	return w, mode, nil
}

// Param is the waiter's id for a look (lease_attempt, claim): nil for no
// waiter, which comes after every waiter of the queue.
func (w *Waiter) Param() pgtype.Text {
	if w == nil {
		return pgtype.Text{}
	}
	return pgtype.Text{String: w.ID, Valid: true}
}

// Polls tells a look that the waiter polls and registers by its looks.
func (w *Waiter) Polls() bool { return w != nil && w.lazy }

// RankParam is the waiter's rank for a look: 0 for no waiter.
func (w *Waiter) RankParam() int32 {
	if w == nil {
		return 0
	}
	return w.rank
}

// Stop unsubscribes and has the registration removed (Leave), not on the
// caller's goroutine, which goes on at once. The waiter's id is unique,
// so no later registration can be removed by it.
func (w *Waiter) Stop() {
	if w.Removed {
		w.ln.removed(w.Name, w.ID)
		return
	}
	w.ln.Leave(w.Name, w.ID)
}

// LeaveNow removes the waiter's registration on conn, on the caller's
// goroutine: a wait about to end by its deadline leaves the queue while
// it runs, on its own connection (the wait loop). The caller sets
// Removed when it succeeded, or is still on its way and will have the
// registration removed in the background if it fails.
func (w *Waiter) LeaveNow(ctx context.Context, conn db.DBTX) error {
	return w.ln.stopWaiting(ctx, conn, w.Name, w.ID)
}

// Wait is Listener.Wait for this waiter (and woken, if not nil) for d,
// the time to a known expiry, at most its next poll when its client holds
// no listen slot.
func (w *Waiter) Wait(ctx context.Context, d time.Duration, woken <-chan struct{}) error {
	if w.poll != nil {
		d = min(d, w.poll.Next())
	}
	return w.ln.Wait(ctx, w.wake, woken, d)
}

// WaitUntil is Wait ended early at leaveAt (zero: never), when the
// caller's deadline is near and the waiter is to leave the queue before
// it (LeaveMargin): that end is exact, without the jitter a wait for d
// gets, which made waits miss it and leave after their deadline. It
// returns nil at leaveAt.
func (w *Waiter) WaitUntil(ctx context.Context, d time.Duration, woken <-chan struct{}, leaveAt time.Time) error {
	if leaveAt.IsZero() {
		return w.Wait(ctx, d, woken)
	}
	wctx, cancel := context.WithDeadline(ctx, leaveAt)
	defer cancel()
	err := w.Wait(wctx, d, woken)
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		return nil // time to leave
	}
	return err
}

// LeaveMargin is how long before its deadline a wait leaves the queue:
// twice its last look (lastLook), so that a look and then its removal
// come back in time (a removal takes about as long as a look), no more
// than a quarter of the wait's time (budget: from its start to its
// deadline), and at least LeaveMarginMin.
func LeaveMargin(lastLook, budget time.Duration) time.Duration {
	return max(min(2*lastLook, budget/4), LeaveMarginMin)
}

// LeaveMarginMin is the least LeaveMargin: a look that came back at once
// does not say the removal will (a variable for tests).
var LeaveMarginMin = 20 * time.Millisecond

// WaitOutage waits out err with backoff b when retrying can fix it (the
// server is down, failing over, or too slow to answer a look within the
// TTL: a wait waits that out too, until ctx ends) and reports retry; any
// other err (or nil) it leaves to the caller. werr is why the wait ended
// early. attrs name what is waited for in the debug log.
func (ln *Listener) WaitOutage(ctx context.Context, b *backoff.Backoff, err error, attrs ...any) (retry bool, werr error) {
	if f, _ := pgerr.Classify(ctx, err); err == nil || f == pgerr.Permanent {
		return false, nil
	}
	d := b.Next()
	ln.cfg.Log.Debug("pgbaton: looking again after a failed look", append(attrs, "in", d, "error", err)...)
	return true, ln.Wait(ctx, nil, nil, d)
}

// AtHead is how long a waiter for a lease held for remaining, with ahead
// waiters before it, waits before it looks again: to the holder's expiry,
// but when nothing will wake it (it polls) and no failover grace or
// lock-delay holds the lease (blocked), at its place in the queue's pace
// (backoff.QueuePoll).
func (w *Waiter) AtHead(remaining time.Duration, ahead int, blocked bool) time.Duration {
	if !blocked && (w.poll != nil || w.ln.polls()) {
		return backoff.QueuePoll(remaining, ahead, w.ln.cfg.PollInterval)
	}
	return remaining
}

// HeldBy tells a waiter for a lease which grant it found in its way: a
// lease that changed hands since the last look is passed around quickly,
// so a waiter without a listen slot looks again soon rather than at its
// backed-off pace, which would leave it behind the waiters that are woken
// or look more often.
func (w *Waiter) HeldBy(token int64) {
	if w.poll != nil && token != w.lastToken {
		w.poll.Reset()
	}
	w.lastToken = token
}

// Wait blocks until a wake-up (on wake or woken), until the known expiry
// (d from now, or PollInterval when notifications are not used) plus
// jitter (backoff.WaitFor), or until ctx or the client ends.
func (ln *Listener) Wait(ctx context.Context, wake, woken <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(backoff.WaitFor(d, ln.polls(), ln.cfg.PollInterval, ln.cfg.TTL))
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
	case <-ln.cfg.Context.Done():
		return pgbaton.ErrClosed
	}
}

// GroupWait is how long a waiter of a group waits before it looks again,
// as pgbaton.group_next_expiry answered (next): until the first live item
// held by another owner expires, ttl at most. With nothing live held by
// another owner (the group is free, held by the waiter's own client, or
// its items expired while an open transaction still locks their rows),
// only a notification would wake the waiter, and a LISTEN connection that
// died without a word is noticed late (a read that fails), so it looks
// again after ttl; waiters that poll look again by PollInterval (Wait).
// During a failover grace, nothing can be granted before it ends, and the
// wait is until then: the grace ends then, or is turned off, which
// notifies every waiter.
func GroupWait(next db.LeaseGroupNextExpiryRow, ttl time.Duration) time.Duration {
	switch {
	case next.GraceUntil != nil:
		return next.GraceUntil.Sub(next.DbNow)
	case next.NextExpiry == nil:
		return ttl
	}
	return min(next.NextExpiry.Sub(next.DbNow), ttl)
}
