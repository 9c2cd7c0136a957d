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

// Lease is one grant of a named lease. The client renews it in the
// background until Release, Complete, Client.Close or loss. Its methods are
// safe for concurrent use.
type Lease struct {
	c     *Client
	name  string
	group string
	token int64

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu         sync.Mutex
	expiresAt  time.Time // database clock
	deadline   time.Time // local, monotonic: lost at this instant unless renewed
	renewT     *time.Timer
	deadlineT  *time.Timer
	inflight   chan struct{} // closed when the running automatic renewal ends
	stopRenew  context.CancelFunc
	ended      bool
	err        error
	afterRenew func(context.Context) // job runs heartbeat here

	releaseOnce sync.Once
	releaseErr  error // guarded by mu

	// For metrics and Client.Check, guarded by mu.
	grantedAt    time.Time // when the acquire was sent
	renewFailing bool      // the last renewal attempt failed
	counted      bool      // the grant was recorded as acquired (set by track)
	recorded     bool      // its end was recorded
}

func newLease(c *Client, name, group string, token int64, expires, start time.Time) *Lease {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Lease{c: c, name: name, group: group, token: token, ctx: ctx, cancel: cancel,
		expiresAt: expires, deadline: start.Add(c.cfg.TTL - c.cfg.SafetyMargin), grantedAt: start}
}

func (l *Lease) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended { // Client.Close got to it first
		return
	}
	l.deadlineT = time.AfterFunc(time.Until(l.deadline), l.checkDeadline)
	l.renewT = time.AfterFunc(l.c.cfg.RenewInterval, l.autoRenew)
}

// Name is the lease's name.
func (l *Lease) Name() string { return l.name }

// Group is the group the lease was claimed from, or "".
func (l *Lease) Group() string { return l.group }

// Token is the fencing token of this grant: larger than the token of
// every earlier grant of this name (tokens of all names come from one
// sequence). Pass it to fenced writes.
func (l *Lease) Token() int64 { return l.token }

// ExpiresAt is when the grant expires by the database clock, as of the
// last successful acquire or renew.
func (l *Lease) ExpiresAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expiresAt
}

// Deadline is the local instant (monotonic clock) at which the holder
// counts the lease lost unless a renewal succeeds first; always before the
// database's expiry.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Done is closed when the lease ends: lost, released or completed.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Err is nil while the lease is held, then an error wrapping ErrLeaseLost
// or ErrReleased.
func (l *Lease) Err() error {
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Context is cancelled when the lease ends, with Err as its cause: run
// work under the lease with it.
func (l *Lease) Context() context.Context { return l.ctx }

// endLocked marks the lease over with cause. A loss is recorded in the
// metrics with lostCause; a release is recorded by finish once the
// database has answered. It returns the running automatic renewal's done
// channel (or nil) for callers that must wait for it.
func (l *Lease) endLocked(cause error, lostCause string) chan struct{} {
	if l.ended {
		return nil
	}
	l.ended = true
	l.err = cause
	if l.renewT != nil {
		l.renewT.Stop()
		l.deadlineT.Stop()
	}
	if l.stopRenew != nil {
		l.stopRenew()
	}
	lost := errors.Is(cause, ErrLeaseLost)
	if lost {
		// Recorded before Done closes, so whoever wakes on Done and reads
		// the metrics sees this loss.
		l.recordEndLocked(lostCause)
	}
	l.cancel(cause)
	l.c.untrack(l)
	if lost {
		l.c.log.Warn("pgbaton: lease lost", "lease", l.name, "token", l.token, "cause", lostCause, "error", cause)
		l.c.goBackground(l.releaseLost)
	}
	return l.inflight
}

func (l *Lease) checkDeadline() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	if d := time.Until(l.deadline); d > 0 { // a renewal moved it
		l.deadlineT.Reset(d)
		return
	}
	// Renewals that failed, or one still in flight (hung), make the loss a
	// renewal failure, unless this timer fired so late that the process
	// must have been paused: then it is an expiry, whatever the renewal.
	lostCause := CauseExpired
	late := time.Since(l.deadline)
	if (l.renewFailing || l.inflight != nil) && late < max(l.c.cfg.SafetyMargin, 50*time.Millisecond) {
		lostCause = CauseRenew
	}
	l.endLocked(fmt.Errorf("%w: %q token %d: no successful renewal before the local deadline", ErrLeaseLost, l.name, l.token), lostCause)
}

// releaseLost gives back a grant the holder counts as lost, best effort:
// a renewal the client gave up on may still have been applied by the
// server, and waiters need not wait for the expiry. Guarded by the token
// like every release, so it never frees somebody else's grant.
func (l *Lease) releaseLost(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, l.c.cfg.TTL)
	defer cancel()
	_, err := l.c.q.LeaseRelease(ctx, l.c.pool, db.LeaseReleaseParams{Name: l.name, Owner: l.c.cfg.Owner, Token: l.token})
	if err != nil {
		l.c.log.Debug("pgbaton: release of lost lease failed; it expires at its TTL", "lease", l.name, "error", err)
	}
}

// autoRenew runs on the renew timer's goroutine.
func (l *Lease) autoRenew() {
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return
	}
	if !time.Now().Before(l.deadline) {
		// Woken late (the process was paused): too late to renew.
		l.endLocked(fmt.Errorf("%w: %q token %d: the local deadline passed before the renewal was due to be sent", ErrLeaseLost, l.name, l.token), CauseExpired)
		l.mu.Unlock()
		return
	}
	ctx, cancel := context.WithDeadline(l.c.bg, l.deadline)
	done := make(chan struct{})
	l.inflight, l.stopRenew = done, cancel
	after := l.afterRenew
	l.mu.Unlock()

	err := l.renew(ctx)
	if err == nil && after != nil {
		after(ctx)
	}
	cancel()

	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight, l.stopRenew = nil, nil
	close(done)
	if err != nil && (!l.ended || errors.Is(l.err, ErrLeaseLost)) {
		// Not a renewal cancelled by Release.
		l.c.renewFailed(l.metricName())
	}
	if l.ended {
		return
	}
	switch {
	case err == nil:
		if l.renewFailing {
			l.renewFailing = false
			l.c.log.Info("pgbaton: lease renewal succeeded again", "lease", l.name, "token", l.token)
		}
		l.renewT.Reset(l.c.cfg.RenewInterval)
	case errors.Is(err, ErrNotHeld):
		l.endLocked(fmt.Errorf("%w: %w", ErrLeaseLost, err), CauseSuperseded)
	default:
		l.renewFailing = true
		// Retry while the deadline allows; the deadline timer ends the
		// lease if no retry succeeds.
		retry := max(l.c.cfg.RenewInterval/5, time.Millisecond)
		l.c.log.Warn("pgbaton: lease renewal failed; retrying", "lease", l.name, "token", l.token,
			"retry_in", retry, "until", time.Until(l.deadline), "error", err)
		l.renewT.Reset(retry)
	}
}

// renew sends one renewal and, on success, moves the expiry and the local
// deadline forward.
func (l *Lease) renew(ctx context.Context) error {
	start := time.Now()
	exp, err := l.c.q.LeaseRenew(ctx, l.c.pool, db.LeaseRenewParams{
		Name: l.name, Owner: l.c.cfg.Owner, Token: l.token, TtlMs: l.c.ttlMs,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %q token %d: renewal refused", ErrNotHeld, l.name, l.token)
	}
	if err != nil {
		return l.c.dbError("renew "+l.name, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return nil
	}
	// Renewals may overlap (Renew and the automatic one); keep the latest.
	if d := start.Add(l.c.cfg.TTL - l.c.cfg.SafetyMargin); d.After(l.deadline) {
		l.deadline = d
		l.expiresAt = exp
	}
	return nil
}

// Renew extends the grant now, in addition to the automatic renewals. It
// returns an error wrapping ErrNotHeld, and the lease ends as lost, when
// the database no longer has this grant; a lease that already ended
// returns its Err.
func (l *Lease) Renew(ctx context.Context) error {
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return l.err
	}
	deadline := l.deadline
	l.mu.Unlock()
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err := l.renew(ctx)
	if err != nil {
		l.c.renewFailed(l.metricName())
	}
	if errors.Is(err, ErrNotHeld) {
		l.mu.Lock()
		l.endLocked(fmt.Errorf("%w: %w", ErrLeaseLost, err), CauseSuperseded)
		l.mu.Unlock()
	}
	return err
}

// Release gives the lease back and wakes waiters. The lease ends first
// (Done closes, with cause ErrReleased unless it was already lost), so work
// under it stops before anyone else can be granted it. It returns an error
// wrapping ErrNotHeld when the database no longer had this grant (taken
// over, or already given back after a loss), in which case nothing was
// changed. Calling it again returns the first result.
func (l *Lease) Release(ctx context.Context) error {
	return l.finish(ctx, false)
}

// Complete ends the lease and deletes its row: the shard or work item is
// done and will not be claimed again. Guarded like Release.
func (l *Lease) Complete(ctx context.Context) error {
	return l.finish(ctx, true)
}

func (l *Lease) finish(ctx context.Context, complete bool) error {
	l.releaseOnce.Do(func() {
		l.stop()
		p := db.LeaseReleaseParams{Name: l.name, Owner: l.c.cfg.Owner, Token: l.token}
		var ok bool
		var err error
		if complete {
			ok, err = l.c.q.LeaseComplete(ctx, l.c.pool, db.LeaseCompleteParams(p))
		} else {
			ok, err = l.c.q.LeaseRelease(ctx, l.c.pool, p)
		}
		switch {
		case err != nil:
			l.setReleaseErr(l.c.dbError("release "+l.name, err))
		case !ok:
			l.setReleaseErr(fmt.Errorf("%w: %q token %d was taken over before release", ErrNotHeld, l.name, l.token))
		}
		l.recordReleased(err == nil && !ok)
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.releaseErr
}

// stop ends the lease as released (unless it ended already) and waits for
// a running renewal, which must not race the release.
func (l *Lease) stop() {
	l.mu.Lock()
	wait := l.endLocked(fmt.Errorf("%w: %q token %d", ErrReleased, l.name, l.token), "")
	l.mu.Unlock()
	if wait != nil {
		<-wait
	}
}

func (l *Lease) setReleaseErr(err error) {
	l.mu.Lock()
	l.releaseErr = err
	l.mu.Unlock()
}
