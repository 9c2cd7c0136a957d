package leasetable

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton/internal/db"
)

// Lease is one grant of a named lease. The client keeps it alive in the
// background — with the keep-alive of its lifeline, one statement per
// renew interval for all its leases — until Release, Complete,
// Client.Close or loss. Its methods are safe for concurrent use.
type Lease struct {
	c     *Client
	name  string
	group string
	token int64
	line  *lifeline // the lifeline keeping it alive, or nil

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu sync.Mutex // guards the fields below; lock order in internals.go
	// state is where the lease is in its life (leaseState); it moves only
	// through transitionLocked, which sets err when the lease ends.
	state leaseState
	err   error
	// expiresAt and own are the grant's own expiry (database clock) and
	// local deadline (monotonic clock), moved only by an explicit Renew.
	// While its lifeline carries it, the lease lasts until the lifeline's
	// deadline if that is later.
	expiresAt  time.Time
	own        time.Time
	deadlineT  *time.Timer           // at own; idle while the lifeline carries the lease
	onLifeline bool                  // own passed while the lifeline was alive
	afterRenew func(context.Context) // set by OnRenew

	// finishedAs is the first of Release, Complete, Client.Complete and
	// CompleteTx (beginFinish), set once whatever the state; releaseErr is
	// what the database answered it.
	finishedAs finishKind
	releaseErr error

	// For metrics.
	grantedAt time.Time // when the acquire was sent
	recorded  bool      // its end was recorded: once, at a loss or when the database answered the give-back
}

// leaseState is where a lease is in its life. It moves only forward, along
// leaseTransitions, through Lease.transitionLocked.
type leaseState uint8

const (
	// leaseHeld: granted and kept alive, by its lifeline's keep-alives or
	// its own deadline (Renew). Done is open. A lease is created held.
	leaseHeld leaseState = iota
	// leaseHandedOff: being completed in a caller's transaction
	// (CompleteTx). Done stays open, so the transaction can still commit
	// under Context; its local deadline no longer ends it and Close no
	// longer releases it: settleLoop ends it when it learns how the
	// transaction ended, or Close does.
	leaseHandedOff
	// leaseReleased: ended on purpose, by Release, Complete, Client.Close,
	// the settling of its CompleteTx transaction, or a close while its
	// grant was in flight. Done is closed, with cause ErrReleased. Final.
	leaseReleased
	// leaseLost: ended by a loss: its local deadline passed, a renewal was
	// refused, an operator force-released it, or it was taken over before
	// CompleteTx. Done is closed, with cause ErrLeaseLost; the loss is
	// counted in the metrics. Final.
	leaseLost

	leaseStates = iota // how many states there are
)

// leaseTransitions are the allowed moves: leaseTransitions[from][to].
// Every other move, including into the state a lease is in, is refused.
var leaseTransitions = [leaseStates][leaseStates]bool{
	leaseHeld:      {leaseHandedOff: true, leaseReleased: true, leaseLost: true},
	leaseHandedOff: {leaseReleased: true, leaseLost: true},
}

func (s leaseState) String() string {
	switch s {
	case leaseHeld:
		return "held"
	case leaseHandedOff:
		return "handed off"
	case leaseReleased:
		return "released"
	case leaseLost:
		return "lost"
	}
	return fmt.Sprintf("leaseState(%d)", uint8(s))
}

// ended reports whether s is final: Done is closed.
func (s leaseState) ended() bool { return s == leaseReleased || s == leaseLost }

// transitionLocked moves l, whose mu is held, to state to if
// leaseTransitions allows it, and does what entering to entails:
//
//   - leaseHandedOff: the client counts l as being completed in a
//     transaction, no longer as held;
//   - leaseReleased, leaseLost: l.err = cause (wrapping ErrReleased or
//     ErrLeaseLost), its deadline timer stops, it leaves its lifeline and
//     the client, and Done closes with cause. A loss is first recorded in
//     the metrics with lostCause (so whoever wakes on Done sees it there),
//     then logged, and the grant is given back in the background; a
//     release is recorded once the database has answered (recordReleased).
//
// It returns the state l was in, and whether it moved.
func (l *Lease) transitionLocked(to leaseState, cause error, lostCause string) (from leaseState, ok bool) {
	from = l.state
	if !leaseTransitions[from][to] {
		return from, false
	}
	l.state = to
	if to == leaseHandedOff {
		l.c.handOff(l)
		return from, true
	}
	l.err = cause
	if l.deadlineT != nil {
		l.deadlineT.Stop()
	}
	if l.line != nil {
		l.line.unbind(l)
	}
	if to == leaseLost {
		l.recordEndLocked(lostCause)
	}
	l.cancel(cause)
	l.c.untrack(l)
	if to == leaseLost {
		l.c.log.Warn("pgbaton: lease lost", "lease", l.name, "token", l.token, "cause", lostCause, "error", cause)
		// Superseded: the database no longer has this grant, so there is
		// nothing to give back.
		if lostCause != CauseSuperseded {
			l.c.goBackground(l.releaseLost)
		}
	}
	return from, true
}

// transition is transitionLocked for callers not holding l.mu.
func (l *Lease) transition(to leaseState, cause error, lostCause string) (from leaseState, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.transitionLocked(to, cause, lostCause)
}

// finishKind is how a lease was given back: the first of Release,
// Complete, Client.Complete or CompleteTx decides, and the later calls
// answer accordingly.
type finishKind int8

const (
	notFinished finishKind = iota
	finishedRelease
	finishedComplete
	finishedCompleteTx
)

func newLease(c *Client, name, group string, token int64, line *lifeline, expires, start time.Time) *Lease {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Lease{c: c, name: name, group: group, token: token, line: line, ctx: ctx, cancel: cancel,
		expiresAt: expires, own: start.Add(c.cfg.TTL - c.cfg.SafetyMargin), grantedAt: start}
}

// start binds the lease to its lifeline and arms its deadline timer.
func (l *Lease) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != leaseHeld { // Client.Close got to it first
		return
	}
	if l.line != nil {
		l.line.bind(l)
		if l.line.dead() {
			// The lifeline died between the grant and now; the lease holds
			// by its own deadline, as in the database.
			l.line.unbind(l)
			l.line = nil
		}
	}
	l.deadlineT = time.AfterFunc(time.Until(l.own), l.checkDeadline)
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
	l.mu.Lock()
	exp := l.expiresAt
	l.mu.Unlock()
	if s := l.line; s != nil && s.carries(time.Now()) {
		s.mu.Lock()
		if s.expiresAt.After(exp) {
			exp = s.expiresAt
		}
		s.mu.Unlock()
	}
	return exp
}

// Deadline is the local instant (monotonic clock) at which the holder
// counts the lease lost unless a keep-alive or renewal succeeds first;
// always before the database's expiry.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadlineLocked(time.Now())
}

// deadlineLocked is the later of the lease's own deadline and, while it
// carries the lease, its lifeline's.
func (l *Lease) deadlineLocked(now time.Time) time.Time {
	d := l.own
	if s := l.line; s != nil && s.carries(now) {
		if sd := s.until(); sd.After(d) {
			d = sd
		}
	}
	return d
}

// Done is closed when the lease ends: lost, released or completed. Once
// the monotonic clock has passed Deadline without a successful renewal, it
// is closed by the time Done returns, whether or not the deadline timer has
// run yet.
func (l *Lease) Done() <-chan struct{} {
	l.expireIfPast()
	return l.ctx.Done()
}

// Err is nil while the lease is held, then an error wrapping ErrLeaseLost
// or ErrReleased. It is non-nil from the instant the monotonic clock
// passes Deadline without a successful renewal: a holder that checks Err
// before a write is never told it holds a lease it has lost locally.
func (l *Lease) Err() error {
	if l.ctx.Err() == nil {
		l.expireIfPast()
		if l.ctx.Err() == nil {
			return nil
		}
	}
	return context.Cause(l.ctx)
}

// OnRenew has fn run in the background after every successful keep-alive
// of the lease's lifeline, while the lease is held, with a context that
// ends after RenewInterval: package jobs moves a run's heartbeat with it.
// fn replaces the one set before; nil removes it.
func (l *Lease) OnRenew(fn func(ctx context.Context)) {
	l.mu.Lock()
	l.afterRenew = fn
	l.mu.Unlock()
}

// Context is cancelled when the lease ends, with Err as its cause: run
// work under the lease with it. Its Err and Done look at the deadline as
// the Lease's do.
func (l *Lease) Context() context.Context { return leaseContext{l.ctx, l} }

// leaseContext is the lease's context with Err and Done that end the lease
// at once when its deadline has passed.
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
	return c.Context.Err()
}

// expireIfPast ends the lease now if its local deadline has passed: the
// deadline timer may not have run yet (the process was paused, or the
// runtime is busy), and the loss must not wait for it.
func (l *Lease) expireIfPast() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); !l.state.ended() && !now.Before(l.deadlineLocked(now)) {
		l.deadlinePassedLocked(now, l.line != nil && l.line.trouble())
	}
}

// lose ends the lease as lost with cause (wrapping ErrLeaseLost), unless
// it ended already.
func (l *Lease) lose(cause error, lostCause string) {
	l.transition(leaseLost, cause, lostCause)
}

// checkDeadline runs on the deadline timer, at the lease's own deadline.
func (l *Lease) checkDeadline() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state.ended() {
		return
	}
	now := time.Now()
	if d := l.own.Sub(now); d > 0 { // a Renew moved it
		l.deadlineT.Reset(d)
		return
	}
	if s := l.line; s != nil && s.carries(now) {
		// The lifeline keeps it alive from here on; when the lifeline dies,
		// it ends the lease (lifelineEnded).
		l.onLifeline = true
		return
	}
	l.deadlinePassedLocked(now, l.line != nil && l.line.trouble())
}

// lifelineEnded is called when the lease's lifeline no longer carries it:
// the lease holds until its own deadline, and is lost now if that passed.
// trouble tells keep-alives that were failing or hanging when the
// lifeline ended.
func (l *Lease) lifelineEnded(trouble bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state.ended() || !l.onLifeline {
		return // its own timer still runs, and sees the lifeline gone
	}
	l.onLifeline = false
	now := time.Now()
	if d := l.own.Sub(now); d > 0 {
		l.deadlineT.Reset(d)
		return
	}
	l.deadlinePassedLocked(now, trouble)
}

// deadlinePassedLocked ends a lease whose local deadline has passed;
// trouble tells keep-alives that were failing or hanging.
func (l *Lease) deadlinePassedLocked(now time.Time, trouble bool) {
	if l.state == leaseHandedOff {
		// Completed in a transaction: its end is settled there.
		return
	}
	// Keep-alives that failed, or one still in flight (hung), make the loss
	// a renewal failure, unless the deadline was noticed so late that the
	// process must have been paused: then it is an expiry, whatever the
	// keep-alive.
	lostCause := CauseExpired
	passed := l.own
	if s := l.line; s != nil && s.until().After(passed) {
		passed = s.until() // the lifeline's last deadline, dead or not
	}
	late := now.Sub(passed)
	if trouble && late < max(l.c.cfg.SafetyMargin, 50*time.Millisecond) {
		lostCause = CauseRenew
	}
	l.transitionLocked(leaseLost, fmt.Errorf("%w: %q token %d: no successful keep-alive or renewal before the local deadline", ErrLeaseLost, l.name, l.token), lostCause)
}

// releaseLost gives back a grant the holder counts as lost, best effort:
// a keep-alive the client gave up on may still have been applied by the
// server, and waiters need not wait for the expiry. Guarded by the token
// like every release, so it never frees somebody else's grant.
func (l *Lease) releaseLost(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, l.c.cfg.ReleaseTimeout)
	defer cancel()
	if _, err := l.release(ctx); err != nil {
		l.c.log.Debug("pgbaton: release of lost lease failed; it expires at its TTL", "lease", l.name, "error", err)
	}
}

// Renew extends this grant's own expiry now, in addition to the lifeline's
// keep-alives, in a statement of its own. It returns an error wrapping
// ErrNotHeld, and the lease ends as lost, when the database no longer has
// this grant; a lease that already ended returns its Err.
func (l *Lease) Renew(ctx context.Context) error {
	l.mu.Lock()
	if l.state.ended() {
		l.mu.Unlock()
		return l.err
	}
	if l.state == leaseHandedOff {
		l.mu.Unlock()
		return fmt.Errorf("%w: %q token %d: completed in a transaction", ErrReleased, l.name, l.token)
	}
	deadline := l.deadlineLocked(time.Now())
	l.mu.Unlock()
	ctx, cancel := context.WithDeadline(ctx, deadline)
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
		l.c.renewFailed(l.metricName(), err)
		l.lose(fmt.Errorf("%w: %w", ErrLeaseLost, err), CauseSuperseded)
		return err
	case err != nil:
		l.c.renewFailed(l.metricName(), err)
		return l.c.dbError("renew "+l.name, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// Renewals may overlap; keep the latest.
	if d := start.Add(l.c.cfg.TTL - l.c.cfg.SafetyMargin); !l.state.ended() && d.After(l.own) {
		l.own, l.expiresAt = d, exp
		if l.onLifeline {
			l.onLifeline = false
			l.deadlineT.Reset(time.Until(d))
		}
	}
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
// The release is sent even when ctx has ended, on a context of its own
// bounded by Config.ReleaseTimeout, so a cancelled request still gives its
// lease back at once. If it cannot reach the database, the error says so,
// the row stays until its TTL, and Client.Close tries again.
//
// After CompleteTx, Release gives the item back if the transaction did not
// commit, and returns nil either way; call it after the transaction ended.
func (l *Lease) Release(ctx context.Context) error {
	return l.finish(ctx, finishedRelease)
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
	return l.finish(ctx, finishedComplete)
}

func (l *Lease) finish(ctx context.Context, kind finishKind) error {
	first, proceed := l.beginFinish(kind)
	if proceed {
		l.giveBack(ctx, kind == finishedComplete)
	}
	l.mu.Lock()
	as, err := l.finishedAs, l.releaseErr
	l.mu.Unlock()
	switch {
	case first:
	case kind == finishedComplete && as == finishedRelease:
		return fmt.Errorf("%w: %q token %d was released before completion; the item was not completed", ErrNotHeld, l.name, l.token)
	case kind == finishedRelease && as == finishedCompleteTx:
		return l.releaseAfterTx(ctx)
	}
	return err
}

// beginFinish decides, if nothing was decided yet, that l is given back as
// kind, and moves it on: handed off for a completion in a transaction,
// else released (unless it ended already). first says this call decided;
// proceed that the caller should now give l back. A lease lost before is
// not completed: proceed is false and l's release error says so (the
// release of the lost grant in the background frees it unless somebody
// took it over).
func (l *Lease) beginFinish(kind finishKind) (first, proceed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finishedAs != notFinished {
		return false, false
	}
	l.finishedAs = kind
	if l.state == leaseLost && kind != finishedRelease {
		l.releaseErr = fmt.Errorf("%w: %q token %d was lost before completion; the item was not completed: %w", ErrNotHeld, l.name, l.token, l.err)
		return true, false
	}
	if kind == finishedCompleteTx {
		l.transitionLocked(leaseHandedOff, nil, "")
	} else {
		l.transitionLocked(leaseReleased, &releasedError{l.name, l.token}, "")
	}
	return true, true
}

// releasedError is ErrReleased for one lease, as fmt.Errorf("%w: %q
// token %d") would say it, but formatted only when read: every released or
// completed lease gets one, and few are ever read (formatting them all
// was a tenth of the client's CPU completing batches of 100).
type releasedError struct {
	name  string
	token int64
}

func (e *releasedError) Error() string {
	return fmt.Sprintf("%s: %q token %d", ErrReleased, e.name, e.token)
}

func (e *releasedError) Unwrap() error { return ErrReleased }

// giveBack sends the release or completion of a stopped lease on a
// context detached from ctx and records the outcome.
func (l *Lease) giveBack(ctx context.Context, complete bool) {
	ctx, cancel := l.c.cleanupContext(ctx)
	defer cancel()
	var ok bool
	var err error
	if complete {
		// Not repeated after a broken connection: the repeat would find
		// the row gone and say taken over.
		err = l.c.retry(ctx, false, func(ctx context.Context) (err error) {
			ok, err = l.c.q.LeaseComplete(ctx, l.c.pool, db.LeaseCompleteParams{Name: l.name, Owner: l.c.cfg.Owner, Token: l.token})
			return err
		})
	} else {
		ok, err = l.release(ctx)
	}
	switch {
	case err != nil:
		l.setReleaseErr(l.c.dbError("release "+l.name, err))
		l.c.remember(l)
	case !ok && complete:
		l.setReleaseErr(fmt.Errorf("%w: %q token %d was taken over before completion; the item was not completed", ErrNotHeld, l.name, l.token))
	case !ok:
		l.setReleaseErr(fmt.Errorf("%w: %q token %d was taken over before release", ErrNotHeld, l.name, l.token))
	}
	l.recordReleased(err == nil && !ok)
}

// releaseAfterTx gives back the row of a lease completed in a transaction
// that did not commit; when it did, the row is gone and there is nothing
// to do.
func (l *Lease) releaseAfterTx(ctx context.Context) error {
	ctx, cancel := l.c.cleanupContext(ctx)
	defer cancel()
	if _, err := l.release(ctx); err != nil {
		return l.c.dbError("release "+l.name, err)
	}
	return nil
}

// release gives back this grant, guarded by its token, and reports
// whether the database still had it. Every single release goes through
// here: safe to repeat, it is sent again on a fresh connection after a
// broken one or a role flip (retry).
func (l *Lease) release(ctx context.Context) (ok bool, err error) {
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

func (l *Lease) setReleaseErr(err error) {
	l.mu.Lock()
	l.releaseErr = err
	l.mu.Unlock()
}
