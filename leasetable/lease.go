package leasetable

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton/internal/completion"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/leasestate"
	"github.com/pgbaton/pgbaton/internal/session"
)

// Lease is one grant of a named lease. The client keeps it alive in the
// background — with the keep-alive of its lease session, one statement per
// renew interval for all its leases — until Release, Complete,
// Client.Close or loss. Its methods are safe for concurrent use.
//
// A Lease has no lock: what changes is one immutable leasestate.Status,
// replaced whole in st.
type Lease struct {
	_         [0]func() // not comparable, as when it held its cancel function
	c         *Client
	name      string
	group     string
	token     int64
	sess      *session.Session // the session it was granted in (never nil; it may have ended since)
	grantedAt time.Time        // when the acquire was sent, for metrics

	// ctx is the lease's context, made at the first Done, Err or Context.
	ctx leasestate.Ctx

	st         leasestate.Cell
	afterRenew atomic.Pointer[func(context.Context)] // set by OnRenew

	// Allocated with the Lease rather than each on its own, as every
	// claimed item has them: its first status, and the cause of its
	// context once released.
	first    leasestate.Status
	released releasedError
}

// transition moves l to state to if leasestate allows it, and does
// what entering it entails (entered).
func (l *Lease) transition(to leasestate.State, cause error, lostCause string) {
	if old, ok := l.st.Update(func(s *leasestate.Status) bool { return s.Move(to, cause) }); ok {
		l.entered(to, old, cause, lostCause)
	}
}

// entered does what entering to entails, once stored (old is the status
// before): an end closes Done with cause; a loss is first recorded with
// lostCause (so whoever wakes on Done sees it in the metrics), then logged,
// and the grant goes to the keeper to be given back.
func (l *Lease) entered(to leasestate.State, old leasestate.Status, cause error, lostCause string) {
	if !to.Ended() {
		return
	}
	if to == leasestate.Lost && !old.Recorded {
		l.c.tel.Ended(context.Background(), l.metricName(), time.Since(l.grantedAt), lostCause)
	}
	l.ctx.End(cause)
	if to == leasestate.Lost {
		l.c.log.Warn("pgbaton: lease lost", "lease", l.name, "token", l.token, "cause", lostCause, "error", cause)
		// Superseded: the database no longer has this grant, so there is
		// nothing to give back.
		if lostCause != CauseSuperseded {
			l.c.k.giveBack([]*Lease{l})
		}
	}
}

// newLeases makes the Leases of grants made in one round trip, bound to
// session s, in one allocation.
func newLeases(c *Client, group string, rows []db.LeaseClaimRow, s *session.Session, start time.Time) []*Lease {
	all, leases := make([]Lease, len(rows)), make([]*Lease, len(rows))
	for i, r := range rows {
		l := &all[i]
		l.c, l.name, l.group, l.token, l.sess, l.grantedAt = c, r.Name, group, r.Token, s, start
		l.first = leasestate.Status{ExpiresAt: r.ExpiresAt, Own: start.Add(c.cfg.TTL - c.cfg.SafetyMargin)}
		l.st.Store(&l.first)
		l.released = releasedError{r.Name, r.Token}
		leases[i] = l
	}
	return leases
}

// Name is the lease's name.
func (l *Lease) Name() string { return l.name }

// Group is the group the lease was claimed from, or "".
func (l *Lease) Group() string { return l.group }

// Token is the fencing token of this grant: larger than the token of
// every earlier grant of this name (tokens of all names come from one
// sequence). Pass it to fenced writes.
func (l *Lease) Token() int64 { return l.token }

// ExpiresAt is when the grant expires by the database clock unless kept
// alive further, as of the last successful acquire, renew or keep-alive.
func (l *Lease) ExpiresAt() time.Time {
	return l.sess.ExpiresAt(l.st.Load().ExpiresAt, time.Now())
}

// Deadline is the local instant (monotonic clock) at which the holder
// counts the lease lost unless a keep-alive or renewal succeeds first;
// always before the database's expiry.
func (l *Lease) Deadline() time.Time { return l.sess.Deadline(l.st.Load().Own, time.Now()) }

// Done is closed when the lease ends: lost, released or completed. Once
// the monotonic clock has passed Deadline without a successful renewal, it
// is closed by the time Done returns, whether or not the keeper has
// noticed yet.
func (l *Lease) Done() <-chan struct{} {
	l.expireIfPast()
	return l.context().Done()
}

// Err is nil while the lease is held, then an error wrapping ErrLeaseLost
// or ErrReleased. It is non-nil from the instant the monotonic clock
// passes Deadline without a successful renewal: a holder that checks Err
// before a write is never told it holds a lease it has lost locally.
func (l *Lease) Err() error {
	ctx := l.context()
	if (leaseContext{ctx, l}).Err() == nil {
		return nil
	}
	return context.Cause(ctx)
}

// OnRenew has fn run in the background after every successful keep-alive
// of the lease's session, while the lease is held, with a context that
// ends after RenewInterval: package jobs moves a run's heartbeat with it.
// fn replaces the one set before; nil removes it.
func (l *Lease) OnRenew(fn func(ctx context.Context)) {
	if fn == nil {
		l.afterRenew.Store(nil)
		return
	}
	l.afterRenew.Store(&fn)
}

// Context is cancelled when the lease ends, with Err as its cause: run
// work under the lease with it. Its Err and Done look at the deadline as
// the Lease's do.
func (l *Lease) Context() context.Context { return leaseContext{l.context(), l} }

// context is l's context (leasestate.Ctx).
func (l *Lease) context() context.Context { return l.ctx.Get(&l.st) }

// leaseContext's Err and Done end the lease once its deadline passed.
type leaseContext struct {
	context.Context
	l *Lease
}

func (c leaseContext) Done() <-chan struct{} { return c.l.Done() }

func (c leaseContext) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	c.l.expireIfPast()
	return c.l.context().Err() // ended by another goroutine meanwhile: see Ctx.Get
}

// expireIfPast ends the lease now if its local deadline has passed,
// without waiting for the keeper to notice.
func (l *Lease) expireIfPast() {
	if st, now := l.st.Load(), time.Now(); !st.State.Ended() && !now.Before(l.sess.Deadline(st.Own, now)) {
		l.deadlinePassed(now, l.sess.Trouble())
	}
}

// lose ends the lease as lost with cause (wrapping ErrLeaseLost), unless
// it ended already.
func (l *Lease) lose(cause error, lostCause string) {
	l.transition(leasestate.Lost, cause, lostCause)
}

// deadlinePassed ends a lease whose local deadline has passed; trouble
// tells keep-alives that were failing or hanging.
func (l *Lease) deadlinePassed(now time.Time, trouble bool) {
	st := l.st.Load()
	if st.State != leasestate.Held {
		// Completed in a transaction: its end is settled there.
		return
	}
	lostCause := CauseExpired
	if l.sess.RenewFailure(st.Own, trouble, now, l.c.cfg.SafetyMargin) {
		lostCause = CauseRenew
	}
	l.transition(leasestate.Lost, fmt.Errorf("%w: %q token %d: no successful keep-alive or renewal before the local deadline", ErrLeaseLost, l.name, l.token), lostCause)
}

// Renew extends this grant's own expiry now, in addition to the session's
// keep-alives, in a statement of its own. It returns an error wrapping
// ErrNotHeld, and the lease ends as lost, when the database no longer has
// this grant; a lease that already ended returns its Err.
func (l *Lease) Renew(ctx context.Context) error {
	st := l.st.Load()
	if st.State.Ended() {
		return st.Err
	}
	if st.State == leasestate.HandedOff {
		return fmt.Errorf("%w: %q token %d: completed in a transaction", ErrReleased, l.name, l.token)
	}
	ctx, cancel := context.WithDeadline(ctx, l.sess.Deadline(st.Own, time.Now()))
	defer cancel()
	start := time.Now()
	var exp time.Time
	err := l.c.retry(ctx, true, func(ctx context.Context) (err error) {
		exp, err = l.c.q.LeaseRenew(ctx, l.c.pool, db.LeaseRenewParams{
			Name: l.name, Owner: l.c.cfg.Owner, Token: l.token, TtlMs: l.c.ttlMs,
		})
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		err = fmt.Errorf("%w: %q token %d: renewal refused", ErrNotHeld, l.name, l.token)
		l.c.tel.RenewFailed(context.Background(), l.metricName(), err)
		l.lose(fmt.Errorf("%w: %w", ErrLeaseLost, err), CauseSuperseded)
		return err
	case err != nil:
		l.c.tel.RenewFailed(context.Background(), l.metricName(), err)
		return l.c.dbError("renew "+l.name, err)
	}
	l.st.Renewed(start.Add(l.c.cfg.TTL-l.c.cfg.SafetyMargin), exp)
	return nil
}

// Release gives the lease back and wakes waiters. The lease ends first
// (Done closes, with cause ErrReleased unless it was already lost), so work
// under it stops before anyone else can be granted it. It returns an error
// wrapping ErrNotHeld when the database no longer had this grant (taken
// over, or already given back after a loss), in which case nothing was
// changed. Calling it again returns the first result; after Complete it
// returns Complete's.
//
// The release is sent even when ctx has ended, bounded by
// Config.ReleaseTimeout; if it cannot reach the database, the error says
// so, the row stays until its TTL, and Client.Close tries again.
//
// After CompleteTx, Release gives the item back if the transaction did not
// commit, and returns nil either way; call it after the transaction ended.
func (l *Lease) Release(ctx context.Context) error {
	return l.finish(ctx, leasestate.Release)
}

// Complete ends the lease and deletes its row: the shard or work item is
// done and will not be claimed again. Guarded like Release, and sent like
// it when ctx has ended. It returns an error wrapping ErrNotHeld, and the
// item was not completed, when the lease was released or lost before, the
// database no longer had this grant, or the lease was given to CompleteTx
// and that completion failed or its transaction rolled back; the item is
// then claimed again. After a CompleteTx whose transaction committed or is
// still open it returns nil. Calling it again returns the first result.
func (l *Lease) Complete(ctx context.Context) error {
	return l.finish(ctx, leasestate.Complete)
}

func (l *Lease) finish(ctx context.Context, kind leasestate.Finish) error {
	first, proceed := l.beginFinish(kind)
	switch {
	case proceed && kind == leasestate.Complete:
		_ = l.c.complete(ctx, &completion.Batch[*Lease]{Sent: []*Lease{l}}) // its result is l's ReleaseErr
	case proceed:
		l.giveBack(ctx)
	}
	st := l.st.Load()
	as, err := st.FinishedAs, st.ReleaseErr
	switch {
	case first:
	case kind == leasestate.Complete && as == leasestate.Release:
		return fmt.Errorf("%w: %q token %d was released before completion; the item was not completed", ErrNotHeld, l.name, l.token)
	case kind == leasestate.Release && as == leasestate.CompleteTx:
		return l.releaseAfterTx(ctx)
	}
	return err
}

// beginFinish decides, unless decided, that l is given back as kind, and
// moves it on (handed off for CompleteTx, else released). first says this
// call decided; proceed that the caller should now give l back: not for a
// completion of a lost lease, whose release error says so.
func (l *Lease) beginFinish(kind leasestate.Finish) (first, proceed bool) {
	var moved bool
	old, ok := l.st.Update(func(s *leasestate.Status) (decided bool) {
		decided, moved = s.Finish(kind, &l.released, l.lostBeforeCompletion)
		return decided
	})
	switch {
	case !ok:
		return false, false
	case old.State == leasestate.Lost && kind != leasestate.Release:
		return true, false
	case moved:
		to, cause := leasestate.Finishing(kind, &l.released)
		l.entered(to, old, cause, "")
	}
	return true, true
}

// stopReleased decides that leases are released (beginFinish) and returns
// those the caller now gives back.
func stopReleased(leases []*Lease) (stopped []*Lease) {
	for _, l := range leases {
		if _, proceed := l.beginFinish(leasestate.Release); proceed {
			stopped = append(stopped, l)
		}
	}
	return stopped
}

// lostBeforeCompletion is the release error of a completion of l, lost
// before with cause lost.
func (l *Lease) lostBeforeCompletion(lost error) error {
	return fmt.Errorf("%w: %q token %d was lost before completion; the item was not completed: %w", ErrNotHeld, l.name, l.token, lost)
}

// releasedError is ErrReleased for one lease, formatted only when read
// (formatting every one was a tenth of the CPU completing batches of 100).
type releasedError struct {
	name  string
	token int64
}

func (e *releasedError) Error() string {
	return fmt.Sprintf("%s: %q token %d", ErrReleased, e.name, e.token)
}

func (e *releasedError) Unwrap() error { return ErrReleased }

// giveBack sends the release of a stopped lease on a context detached
// from ctx and records the outcome.
func (l *Lease) giveBack(ctx context.Context) {
	ctx, cancel := l.c.cleanupContext(ctx)
	defer cancel()
	ok, err := l.release(ctx)
	switch {
	case err != nil:
		l.st.SetReleaseErr(l.c.dbError("release "+l.name, err))
		l.c.k.giveBack([]*Lease{l})
	case !ok:
		l.st.SetReleaseErr(fmt.Errorf("%w: %q token %d was taken over before release", ErrNotHeld, l.name, l.token))
	}
	l.recordReleased(err == nil && !ok)
}

// releaseAfterTx gives back the row of a lease completed in a transaction
// that did not commit (if it did, the row is gone).
func (l *Lease) releaseAfterTx(ctx context.Context) error {
	ctx, cancel := l.c.cleanupContext(ctx)
	defer cancel()
	if _, err := l.release(ctx); err != nil {
		return l.c.dbError("release "+l.name, err)
	}
	return nil
}

// release gives back this grant and reports whether the database still
// had it; safe to repeat after a broken connection (retry).
func (l *Lease) release(ctx context.Context) (ok bool, err error) {
	if l.st.Load().State == leasestate.Lost {
		freed, err := l.c.releaseMany(ctx, []string{l.name}, []int64{l.token}, []string{l.name})
		return len(freed) == 1, err
	}
	var r db.LeaseReleaseRow
	err = l.c.retry(ctx, true, func(ctx context.Context) (err error) {
		r, err = l.c.q.LeaseRelease(ctx, l.c.pool, db.LeaseReleaseParams{Name: l.name, Owner: l.c.cfg.Owner, Token: l.token})
		return err
	})
	if err == nil && r.Waiters {
		l.c.notifyWaiters(ctx, []string{l.name})
	}
	return r.Released, err
}
