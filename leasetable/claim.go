package leasetable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/completion"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/inflight"
	"github.com/pgbaton/pgbaton/internal/leasestate"
	"github.com/pgbaton/pgbaton/internal/listener"
	"github.com/pgbaton/pgbaton/internal/pgerr"
	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// maxClaim bounds the n of one claim.
const maxClaim = 1 << 20

// Register creates free lease rows for names in group: shards, work items
// or slots that Claim hands out. It returns how many rows were new; names
// already registered in group are left as they are. A name that exists
// outside group is an error (pgbaton.ErrInvalidArgument) and nothing is
// created.
func (c *Client) Register(ctx context.Context, group string, names ...string) (int, error) {
	if err := checkName("group", group); err != nil {
		return 0, err
	}
	if len(names) == 0 {
		return 0, invalid("Register needs at least one name")
	}
	for _, n := range names {
		if err := checkName("lease name", n); err != nil {
			return 0, err
		}
	}
	if err := c.checkOpen(); err != nil {
		return 0, err
	}
	return c.register(ctx, group, names)
}

func (c *Client) register(ctx context.Context, group string, names []string) (int, error) {
	var n int32
	err := c.retry(ctx, false, func(ctx context.Context) (err error) {
		n, err = c.q.LeaseRegister(ctx, c.pool, db.LeaseRegisterParams{LeaseGroup: group, Names: names})
		return err
	})
	if err != nil {
		return 0, c.dbError("register in "+group, err)
	}
	return int(n), nil
}

// Claim takes up to n leases of group that are free: never held, released,
// or expired. Each gets its own new token and is kept alive like any
// lease. Concurrent claimers never wait on each other nor get the same
// lease (FOR UPDATE SKIP LOCKED). It returns fewer than n leases, maybe
// none, when no more are free; it does not wait (ClaimWait does).
func (c *Client) Claim(ctx context.Context, group string, n int) ([]*Lease, error) {
	if err := c.checkClaim(group, n); err != nil {
		return nil, err
	}
	return c.once(ctx, spanClaim, telemetry.GroupKey, group, func(ctx context.Context, start time.Time) ([]*Lease, error) {
		return c.claim(ctx, group, n, start, nil, false)
	})
}

// ClaimWait is Claim that waits while nothing is free: it returns at least
// one and at most n leases of group, or an error, ctx's when ctx ends
// first (the caller got nothing). A worker's loop calls it instead of
// sleeping when the queue is empty.
//
// It wakes when items are registered in group (Register notifies the
// group's waiters, once per call) or released, on the client's one LISTEN
// connection, and at the earliest expiry of an item another owner holds,
// which the database knows: a dead worker's items are taken over when
// their TTL runs out. With NoListen, or where notifications are not
// delivered, it looks again every Config.PollInterval instead. Failing
// that, it looks again after the client's TTL. Like Acquire it waits out
// a server that cannot be reached, until ctx ends.
//
// Waiters queue in the order they came: a registration or a release wakes
// as many of them as items became free, oldest first. The items go to
// whoever claims first (Claim does not wait its turn): in a work queue
// throughput comes first.
func (c *Client) ClaimWait(ctx context.Context, group string, n int) ([]*Lease, error) {
	return c.claimWaiting(ctx, group, n, false)
}

// claimWaiting is ClaimWait, and with drain ClaimUntilDrained, with their
// metrics and span.
func (c *Client) claimWaiting(ctx context.Context, group string, n int, drain bool) ([]*Lease, error) {
	if err := c.checkClaim(group, n); err != nil {
		return nil, err
	}
	start := time.Now()
	return c.waitCall(ctx, spanClaim, telemetry.GroupKey, start, want{kind: "group", name: group, drain: drain, look: func(ctx context.Context, w *listener.Waiter) ([]*Lease, error) {
		return c.claim(ctx, group, n, start, w, false)
	}})
}

// checkClaim checks the arguments of a claim and that c is open.
func (c *Client) checkClaim(group string, n int) error {
	if err := checkName("group", group); err != nil {
		return err
	}
	if n <= 0 || n > maxClaim {
		return invalid("claim count must be in 1..%d, got %d", maxClaim, n)
	}
	return c.checkOpen()
}

// claim claims up to n leases of group; each grant is recorded as an
// acquired attempt that began at waitStart. w is the caller's place in the
// group's wait queue, if it waits; with fair, the group's free leases go
// to the waiters ahead of it first (semaphores).
func (c *Client) claim(ctx context.Context, group string, n int, waitStart time.Time, w *listener.Waiter, fair bool) ([]*Lease, error) {
	start := time.Now()
	s, err := c.sessionFor(ctx)
	if err != nil {
		return nil, err
	}
	defer c.k.unuse()
	// Sent again after a broken connection with Retry set, the claim
	// returns what the first one granted instead of claiming more.
	p := db.LeaseClaimParams{LeaseGroup: group, Owner: c.cfg.Owner, N: int32(n), TtlMs: c.ttlMs, Session: s.Param(), Ref: inflight.NewRef(),
		Waiter: w.Param(), Fair: fair}
	rows, err := grant(c, ctx, s, p.Ref, w, "claim from "+group, func(ctx context.Context) ([]db.LeaseClaimRow, error) {
		rows, err := c.q.LeaseClaim(ctx, c.pool, p)
		p.Retry = true
		return rows, err
	}, func(rows []db.LeaseClaimRow) bool { return len(rows) > 0 })
	if err != nil {
		return nil, err
	}
	return c.track(group, rows, s, start, waitStart)
}

// Complete ends leases and deletes their rows in one round trip: the work
// items are done and will not be claimed again. Each is guarded by its
// token like Lease.Complete, and sent like it when ctx has ended. Leases
// that were released or lost before, or taken over meanwhile, are not
// completed (the others are) and the error, wrapping ErrNotHeld, names
// them. Leases completed before are skipped.
func (c *Client) Complete(ctx context.Context, leases ...*Lease) (err error) {
	ctx, span := c.tr.Start(ctx, spanComplete, "lease")
	defer func() { telemetry.EndComplete(span, c.cfg.Owner, len(leases), err) }()
	cb, err := c.startCompletion(leases)
	if err != nil {
		return err
	}
	return c.complete(ctx, cb)
}

// complete deletes the rows of cb's leases in one round trip, sent like a
// release when ctx has ended, and records the outcome (Complete and
// Lease.Complete).
func (c *Client) complete(ctx context.Context, cb *completion.Batch[*Lease]) error {
	if len(cb.Sent) == 0 {
		return finish(cb, nil, nil)
	}
	ctx, cancel := c.cleanupContext(ctx)
	defer cancel()
	// Not repeated after a broken connection: a second answer would call
	// the items the first one completed taken over.
	names, tokens := grants(cb.Sent)
	p := db.LeaseCompleteManyParams{Names: names, Tokens: tokens, Owner: c.cfg.Owner}
	var deleted []string
	err := c.retry(ctx, false, func(ctx context.Context) (err error) {
		deleted, err = c.q.LeaseCompleteMany(ctx, c.pool, p)
		return err
	})
	if err != nil {
		err = c.dbError("complete", err)
	}
	return finish(cb, deleted, err)
}

// CompleteAndClaim completes done (as Complete) and claims up to n leases
// of group (as Claim) in one round trip and one transaction: a worker's
// loop pays one commit per batch instead of two. If the round trip fails,
// neither happened: done stay uncompleted, and are given back once the
// server is reached again (at their TTL at the latest) and claimed again,
// as after a failed Complete. If some of done were
// not completed (released, lost or taken over before), the error wraps
// ErrNotHeld and the claimed leases are returned all the same: they are
// held and must be completed or released.
//
// Concurrent calls of one Client on the same group are sent together:
// the finished leases of all of them complete, and the sum of their counts
// is claimed, in one round trip and one commit, each caller getting its
// own leases, up to its n. A call that finds fewer than two of them in
// flight is sent at once; while two are in flight, the calls that arrive
// go together in the next. A failed round trip fails every call in it.
//
// The effects of done were committed before this call: a worker killed
// between that commit and this one has its items done again by another
// worker. For exactly-once effects complete each item in the transaction
// of its effects with CompleteTx.
func (c *Client) CompleteAndClaim(ctx context.Context, group string, n int, done ...*Lease) (claimed []*Lease, err error) {
	start := time.Now()
	ctx, span := c.tr.Start(ctx, spanClaim, "lease")
	defer func() { c.endGrant(span, telemetry.GroupKey, group, start, claimed, err) }()
	if err := c.checkClaim(group, n); err != nil {
		return nil, err
	}
	cb, err := c.startCompletion(done)
	if err != nil {
		return nil, err
	}
	if len(cb.Sent) == 0 {
		doneErr := finish(cb, nil, nil)
		leases, err := c.Claim(ctx, group, n)
		return leases, errors.Join(doneErr, err)
	}
	if ctx.Err() != nil {
		// Nothing is sent: done stay uncompleted.
		return nil, finish(cb, nil, inflight.CtxErr(ctx))
	}
	start = time.Now()
	// Sent together with the calls of the client's other workers on group
	// (combine.go).
	call := &combined{cb: cb, n: n, done: make(chan combinedReply, 1)}
	r, err := inFlight(c, ctx, func(context.Context) (combinedReply, error) {
		return c.completeAndClaimCombined(group, call), nil
	}, func(ctx context.Context, r combinedReply, _ error) { c.settleAbandoned(ctx, call, r) })
	switch {
	case errors.Is(err, pgbaton.ErrClosed): // nothing was sent
		r.err = err
	case err != nil:
		// Given up: the reply, when it comes, settles done and gives back
		// this call's share of the claim.
		err = c.dbError("complete and claim from "+group, err)
		c.attemptFailed(ctx, group, err, start)
		return nil, err
	}
	if r.err != nil {
		c.attemptFailed(ctx, group, r.err, start)
		return nil, finish(cb, nil, r.err)
	}
	doneErr := finish(cb, r.deleted, nil)
	if len(r.claimed) > 0 {
		defer c.k.unuse() // counted by sendCalls
	}
	leases, err := c.track(group, r.claimed, r.s, start, start)
	if err != nil {
		return nil, errors.Join(doneErr, err)
	}
	if len(leases) == 0 {
		c.tel.AttemptSince(ctx, group, telemetry.Held, start)
	}
	return leases, doneErr
}

// CompleteTx completes leases inside tx, the caller's transaction that
// holds the work's effects: the effects and the completions commit
// together or not at all, so a worker killed at any instant never leaves
// an item done but not completed (done twice) nor completed but not done.
//
// Each lease is guarded by its token: if any of them was taken over,
// released, completed or lost, nothing is completed, the error wraps
// ErrNotHeld and names them, and tx is aborted (PostgreSQL refuses its
// further statements and turns COMMIT into ROLLBACK), so the effects
// cannot commit without their completion.
//
// The leases stay open while tx runs, so a transaction run under
// Lease.Context can still commit; the deleted rows stay locked by tx until
// it ends, so nobody can claim them meanwhile. Once tx has ended the
// client learns how, in the background: each lease ends with cause
// ErrReleased, and if tx rolled back its item is released and claimable
// again at once. tx must be a transaction on this client's database; it
// runs in whatever isolation level tx has.
func (c *Client) CompleteTx(ctx context.Context, tx pgbaton.Tx, leases ...*Lease) (err error) {
	ctx, span := c.tr.Start(ctx, spanComplete, "lease")
	defer func() { telemetry.EndComplete(span, c.cfg.Owner, len(leases), err) }()
	if tx == nil {
		return invalid("CompleteTx needs the caller's transaction")
	}
	if len(leases) == 0 {
		return invalid("CompleteTx needs at least one lease")
	}
	if p := completion.Problem("CompleteTx", leases, c.owns, true); p != "" {
		return invalid("%s", p)
	}
	if err := c.checkOpen(); err != nil {
		return err
	}
	names, tokens, handed, unheld := completion.Hand(leases, func(l *Lease) bool {
		_, proceed := l.beginFinish(leasestate.CompleteTx)
		return proceed
	})
	err = c.q.LeaseCompleteTx(ctx, tx, db.LeaseCompleteTxParams{Names: names, Tokens: tokens, Owner: c.cfg.Owner})
	// Whatever the outcome, the rows this statement locked stay locked
	// until tx ends; then settle learns whether it committed.
	defer c.k.settleLater(handed)
	if err == nil {
		for _, l := range handed {
			l.recordReleased(false)
		}
		return nil
	}
	// tx cannot commit this completion: a Complete from now on says the
	// item was not completed.
	for _, l := range handed {
		l.st.SetReleaseErr(fmt.Errorf("%w: %q token %d: its completion in a transaction failed; the item was not completed: %w", ErrNotHeld, l.name, l.token, err))
	}
	if pgerr.Code(err) != pgerr.StaleToken { // complete_tx raises it too
		// tx cannot commit a completion that failed; the rows expire at
		// their TTL unless released.
		return c.dbError("complete in transaction", err)
	}
	// Tell the leases taken over (lost) from those merely rolled back with
	// the rest. tx is aborted, so ask through the pool.
	if len(handed) > 0 {
		names, tokens := grants(handed)
		cctx, cancel := c.cleanupContext(ctx)
		defer cancel()
		still, qerr := c.q.LeaseStillHeld(cctx, c.pool, db.LeaseStillHeldParams{Names: names, Tokens: tokens, Owner: c.cfg.Owner})
		if qerr == nil {
			unheld = completion.Match(handed, still, unheld, func(l *Lease, held bool) {
				if !held {
					l.lose(fmt.Errorf("%w: %w: %q token %d was taken over before completion", ErrLeaseLost, ErrNotHeld, l.name, l.token), CauseSuperseded)
				}
			})
		}
	}
	if len(unheld) == 0 {
		return fmt.Errorf("%w: complete in transaction: %w", ErrNotHeld, err)
	}
	return fmt.Errorf("%w: not completed, the transaction is aborted: %s no longer held with their tokens (taken over, released, completed or lost)",
		ErrNotHeld, quoteNames(unheld, 10))
}

// startCompletion checks leases and stops those not released or completed
// yet; the caller deletes their rows and calls finish.
func (c *Client) startCompletion(leases []*Lease) (*completion.Batch[*Lease], error) {
	if p := completion.Problem("Complete", leases, c.owns, false); p != "" {
		return nil, invalid("%s", p)
	}
	cb := &completion.Batch[*Lease]{Sent: make([]*Lease, 0, len(leases))}
	for _, l := range leases {
		first, proceed := l.beginFinish(leasestate.Complete)
		switch {
		case proceed:
			cb.Sent = append(cb.Sent, l)
		case first: // lost before
			cb.Unheld = append(cb.Unheld, l.name)
		default:
			st := l.st.Load()
			as, err := st.FinishedAs, st.ReleaseErr
			// Released, or a completion that did not take (lost, taken
			// over, a CompleteTx that failed or rolled back).
			if as == leasestate.Release || errors.Is(err, ErrNotHeld) {
				cb.Unheld = append(cb.Unheld, l.name)
			}
		}
	}
	return cb, nil
}

// owns reports whether l is a lease of c.
func (c *Client) owns(l *Lease) bool { return l != nil && l.c == c }

// finish records the outcome of cb: deleted are the names whose rows
// went, err (already mapped) that the round trip failed.
func finish(cb *completion.Batch[*Lease], deleted []string, err error) error {
	if err != nil {
		for _, l := range cb.Sent {
			l.st.SetReleaseErr(err)
			l.recordReleased(false)
		}
		// Stopped but not completed: given back by the keeper (or by
		// Close), not kept alive with the session.
		if len(cb.Sent) > 0 {
			cb.Sent[0].c.k.giveBack(cb.Sent)
		}
		return err
	}
	missing := cb.Settle(deleted, func(l *Lease, gone bool) {
		l.recordReleased(!gone)
		if !gone {
			l.st.SetReleaseErr(fmt.Errorf("%w: %q token %d was taken over before completion; the item was not completed", ErrNotHeld, l.name, l.token))
		}
	})
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: not completed (released, lost or taken over before): %s", ErrNotHeld, quoteNames(missing, 10))
}
