package session

import (
	"context"
	"fmt"
	"time"
)

// The owner's rules for keeping a session alive: when a keep-alive is
// due, when the session is closed idle instead, and what a reply means.
// Sending the statement, and what the verdict does to the leases, are the
// owner's.

// Timing fills in the defaults of a client's TTL (15s), safety margin
// (ttl/10) and renew interval (ttl/3), and says what is wrong with them,
// or "": the local deadline, ttl - margin after a keep-alive was sent,
// must come after the next one.
func Timing(ttl, margin, renew *time.Duration) string {
	if *ttl == 0 {
		*ttl = 15 * time.Second
	}
	if *ttl < time.Millisecond {
		return fmt.Sprintf("TTL must be at least 1ms, got %s", *ttl)
	}
	if *margin == 0 {
		*margin = *ttl / 10
	}
	if *margin < 0 || *margin >= *ttl {
		return fmt.Sprintf("SafetyMargin must be in [0, TTL), got %s with TTL %s", *margin, *ttl)
	}
	if *renew == 0 {
		*renew = *ttl / 3
	}
	if *renew <= 0 || *renew >= *ttl-*margin {
		return fmt.Sprintf("RenewInterval must be positive and shorter than TTL - SafetyMargin (%s), got %s", *ttl-*margin, *renew)
	}
	return ""
}

// Due tells what is due at now: the session's local deadline passed with
// no successful keep-alive (end it, Dead), or its next keep-alive, due at
// keepAt (KeepDue).
func (s *Session) Due(now, keepAt time.Time) (end, keep bool) {
	if !now.Before(s.Until()) {
		return true, false
	}
	return false, !s.Keeping && !now.Before(keepAt)
}

// Next is when the owner must look at the session again (Due): its local
// deadline, or its next keep-alive, due at keepAt, if none is on its way.
func (s *Session) Next(keepAt time.Time) time.Time {
	if s.Keeping || s.Until().Before(keepAt) {
		return s.Until()
	}
	return keepAt
}

// KeepDue is when the next keep-alive is due, for the leases the session
// carries, the earliest of whose own deadlines is oldest (zero: none);
// renew is the renew interval and local the TTL less the safety margin.
//
// A keep-alive is sent for what needs it, never before KeepAt (a renew
// interval after the last one, or a retry after a failure): for a lease a
// renew interval after it was granted (oldest less local, as its own
// deadline is local after its grant was sent), which is when one is due
// for it had the last keep-alive been sent as it was granted; and, held or
// not, a renew interval before the session's deadline, so that it does
// not lapse while the client takes no lease for a while and the next grant
// can bind to it. A lease is held by its own grant until its own deadline,
// in the database as here, so a session whose leases live shorter than a
// renew interval writes a keep-alive only every TTL - margin - renew
// interval (8.5s with the defaults) rather than every renew interval: in a
// fleet of 500 clients that churn short leases, 59 keep-alives a second
// rather than 100, each a write transaction.
func (s *Session) KeepDue(oldest time.Time, renew, local time.Duration) time.Time {
	at := s.Until().Add(-renew)
	if need := oldest.Add(renew - local); !oldest.IsZero() && need.Before(at) {
		at = need
	}
	if at.Before(s.KeepAt) {
		return s.KeepAt
	}
	return at
}

// CloseIdle reports whether the session, unused for ttl at now (Idle),
// is to be closed rather than kept alive: let it go rather than write for
// nothing; the next grant opens a new session. leases says it carries
// some; inUse reads whether it is in use without one (waiters, grants on
// their way). Closing is set first, then the uses are read again: a grant
// counts its use first, then reads Closing, so one of the two sees the
// other (atomics are sequentially consistent) and no grant takes a session
// closed under it.
func (s *Session) CloseIdle(leases bool, inUse func() bool, now time.Time, ttl time.Duration) bool {
	if !s.Idle(leases || inUse(), now, ttl) {
		return false
	}
	s.Closing.Store(true)
	if !inUse() {
		return true
	}
	s.Closing.Store(false)
	s.IdleSince = time.Time{}
	return false
}

// Sending records a keep-alive on its way, which stop ends.
func (s *Session) Sending(stop context.CancelFunc) {
	s.Keeping, s.StopKeep = true, stop
	s.Inflight.Store(true)
}

// Unsent undoes Sending for a keep-alive that could not start.
func (s *Session) Unsent() {
	s.Keeping, s.StopKeep = false, nil
	s.Inflight.Store(false)
}

// Answered records, on the keep-alive's goroutine, its reply r: failed,
// or alive (the local deadline moves to local after it was sent; see
// Extend).
func (s *Session) Answered(r Reply, local time.Duration) {
	if r.Err != nil {
		s.Failing.Store(true) // before Inflight clears: Trouble() never blinks
	} else if r.Alive {
		s.Extend(r.Sent, r.Expires, local)
	}
	s.Inflight.Store(false)
}

// Reply is a keep-alive's reply as its owner reads it.
type Reply struct {
	Sent, Replied time.Time // when it was sent and answered
	Err           error     // it failed, or hung until the deadline
	// The database's answer, when Err is nil: whether it still has the
	// session, and then its expiry, its revocation count and token epoch,
	// and its clock.
	Alive          bool
	Expires        time.Time
	Revoked, Epoch int64
	DBNow          time.Time
}

// Outcome is what a keep-alive's reply means.
type Outcome int

const (
	// Ignore: the session ended meanwhile.
	Ignore Outcome = iota
	// Kept: the database kept the session alive.
	Kept
	// Gone: the database no longer has the session (it expired there
	// first, or a failover lost it); end it, Dead.
	Gone
	// Retry: the keep-alive failed; it is sent again at KeepAt.
	Retry
)

// Verdict is what the owner does after a keep-alive's reply.
type Verdict struct {
	Outcome Outcome
	// Failed: count a renewal failure (the keep-alive failed or hung, and
	// was not stopped by Close).
	Failed bool
	// Recovered: kept after keep-alives failed.
	Recovered bool
	// Step is how much further the database's clock moved than ours, when
	// more than the safety margin (0 otherwise): every lease the session
	// does not carry alive is lost, as the database may have let it go.
	Step time.Duration
	// Look: grants may have gone (Kept); FailedOver: with a timeline
	// change.
	Look, FailedOver bool
	// RetryIn is how soon a failed keep-alive is sent again.
	RetryIn time.Duration
}

// Read records the reply r to the session's keep-alive, read at now, and
// returns the verdict; renew is the renew interval and margin the safety
// margin.
func (s *Session) Read(r Reply, now time.Time, renew, margin time.Duration) Verdict {
	s.Keeping, s.StopKeep = false, nil
	var v Verdict
	v.Failed = r.Err != nil && s.State.Load() != Closed
	if s.State.Load() != Alive {
		return v
	}
	if r.Err == nil {
		if step := s.ClockStep(r.Sent, r.Replied, r.DBNow); step > margin {
			v.Step = step
		}
	}
	switch {
	case r.Err == nil && r.Alive:
		v.Outcome = Kept
		v.Recovered = s.Failing.Swap(false)
		if r.Sent.After(s.RenewedAt) {
			s.RenewedAt = r.Sent
		}
		v.Look, v.FailedOver = s.Kept(r.Revoked, r.Epoch)
		s.KeepAt = now.Add(renew)
	case r.Err == nil:
		v.Outcome = Gone
	default:
		v.Outcome = Retry
		s.Failing.Store(true)
		v.RetryIn = max(renew/keepaliveRetries, time.Millisecond)
		s.KeepAt = now.Add(v.RetryIn)
	}
	return v
}

// keepaliveRetries: a failing keep-alive is retried this many times per
// renew interval, so several tries fit before the deadline.
const keepaliveRetries = 5

// End ends the session, once, as Dead or Closed, stopping a keep-alive on
// its way; false when it ended already. trouble says it died while
// keep-alives were failing or one hung (read before the keep-alive in
// flight is cancelled): a loss now is a renewal failure.
func (s *Session) End(to uint32) (trouble, ok bool) {
	trouble = s.Trouble() && to == Dead
	if !s.State.CompareAndSwap(Alive, to) {
		return false, false
	}
	if s.StopKeep != nil {
		s.StopKeep()
	}
	return trouble, true
}

// Opening is a session being opened, which whoever needs one meanwhile
// waits for.
type Opening struct {
	done chan struct{}
	s    *Session
	err  error
}

// NewOpening returns an Opening not finished yet.
func NewOpening() *Opening { return &Opening{done: make(chan struct{})} }

// Opened returns an Opening finished with s.
func Opened(s *Session) *Opening {
	op := &Opening{done: make(chan struct{}), s: s}
	close(op.done)
	return op
}

// Finish sets the session opened, or why it was not; once.
func (op *Opening) Finish(s *Session, err error) {
	op.s, op.err = s, err
	close(op.done)
}

// Done closes when the Opening is finished.
func (op *Opening) Done() <-chan struct{} { return op.done }

// Result is what the Opening finished with; call it once Done closed.
func (op *Opening) Result() (*Session, error) { return op.s, op.err }
