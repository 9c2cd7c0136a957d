package session

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDueAndNext(t *testing.T) {
	t0 := time.Now()
	s := New(1, 1, t0, t0.Add(time.Second), time.Second, 900*time.Millisecond)
	s.KeepAt = t0.Add(300 * time.Millisecond)
	end, keep := s.Due(t0, s.KeepAt)
	require.False(t, end || keep)
	require.Equal(t, s.KeepAt, s.Next(s.KeepAt))
	end, keep = s.Due(s.KeepAt, s.KeepAt)
	require.True(t, keep && !end)

	// One on its way: nothing more is due until the deadline.
	s.Sending(func() {})
	require.True(t, s.Trouble(), "a keep-alive in flight")
	end, keep = s.Due(s.KeepAt, s.KeepAt)
	require.False(t, end || keep)
	require.Equal(t, s.Until(), s.Next(s.KeepAt))
	end, _ = s.Due(s.Until(), s.KeepAt)
	require.True(t, end)
	s.Unsent()
	require.False(t, s.Keeping || s.Trouble())
}

// TestKeepDueForWhatNeedsIt: a keep-alive is due a renew interval after
// the oldest lease carried was granted, else a renew interval before the
// session's deadline; never before KeepAt.
func TestKeepDueForWhatNeedsIt(t *testing.T) {
	const renew, local = 5 * time.Second, 13500 * time.Millisecond
	t0 := time.Now()
	s := New(1, 1, t0, t0.Add(15*time.Second), 15*time.Second, local)
	s.KeepAt = t0.Add(renew)
	lapse := s.Until().Add(-renew)
	require.Equal(t, t0.Add(8500*time.Millisecond), lapse)

	require.Equal(t, lapse, s.KeepDue(time.Time{}, renew, local), "no lease: only so that it does not lapse")
	// Granted 1s after the session opened: due 5s later, before the lapse.
	require.Equal(t, t0.Add(6*time.Second), s.KeepDue(t0.Add(time.Second+local), renew, local))
	// Granted as it opened (or before the last keep-alive): at KeepAt, as
	// with every renew interval.
	require.Equal(t, s.KeepAt, s.KeepDue(t0.Add(local), renew, local))
	require.Equal(t, s.KeepAt, s.KeepDue(t0.Add(-time.Second), renew, local))
	// Granted late: the lapse comes first.
	require.Equal(t, lapse, s.KeepDue(t0.Add(7*time.Second+local), renew, local))

	// A renew interval too long to leave room before the deadline, or a
	// retry later than either: never before KeepAt.
	require.Equal(t, s.KeepAt, s.KeepDue(time.Time{}, 10*time.Second, local))
	s.KeepAt = t0.Add(9 * time.Second)
	require.Equal(t, s.KeepAt, s.KeepDue(time.Time{}, renew, local))
}

func TestCloseIdleRechecksUses(t *testing.T) {
	t0 := time.Now()
	ttl := time.Second
	s := New(1, 1, t0, t0.Add(ttl), ttl, 900*time.Millisecond)
	free := func() bool { return false }
	require.False(t, s.CloseIdle(true, free, t0.Add(2*ttl), ttl), "it carries leases")
	require.False(t, s.CloseIdle(false, free, t0.Add(3*ttl), ttl), "the first look unused starts the count")

	// A grant took a use while the owner decided: not closed, and the
	// count starts over.
	uses := 0
	inUse := func() bool { uses++; return uses > 1 }
	require.False(t, s.CloseIdle(false, inUse, t0.Add(4*ttl), ttl))
	require.False(t, s.Closing.Load())
	require.True(t, s.IdleSince.IsZero())

	require.False(t, s.CloseIdle(false, free, t0.Add(5*ttl), ttl))
	require.True(t, s.CloseIdle(false, free, t0.Add(6*ttl), ttl))
	require.True(t, s.Closing.Load(), "grants see it closing")
}

func TestReadKeepaliveReplies(t *testing.T) {
	const renew, margin, local = 300 * time.Millisecond, 100 * time.Millisecond, 900 * time.Millisecond
	t0 := time.Now()
	db0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := New(1, 7, t0, db0.Add(time.Second), time.Second, local)
	reply := func(sent time.Duration, r Reply) Reply {
		r.Sent, r.Replied, r.DBNow = t0.Add(sent), t0.Add(sent+10*time.Millisecond), db0.Add(sent+5*time.Millisecond)
		return r
	}

	// Kept: the deadline moves (Answered), the next is due a renew
	// interval after the reply is read, nothing was lost.
	s.Sending(func() {})
	r := reply(renew, Reply{Alive: true, Expires: db0.Add(2 * time.Second), Epoch: 7})
	s.Answered(r, local)
	require.Equal(t, t0.Add(renew+local), s.Until())
	now := t0.Add(renew + 20*time.Millisecond)
	v := s.Read(r, now, renew, margin)
	require.Equal(t, Verdict{Outcome: Kept}, v)
	require.False(t, s.Keeping)
	require.Equal(t, now.Add(renew), s.KeepAt)
	require.Equal(t, r.Sent, s.RenewedAt)

	// Failed: counted, retried within a fifth of the renew interval.
	s.Sending(func() {})
	failed := Reply{Sent: t0.Add(2 * renew), Replied: t0.Add(3 * renew), Err: errors.New("boom")}
	s.Answered(failed, local)
	require.True(t, s.Trouble())
	v = s.Read(failed, t0.Add(3*renew), renew, margin)
	require.Equal(t, Verdict{Outcome: Retry, Failed: true, RetryIn: renew / keepaliveRetries}, v)
	require.Equal(t, t0.Add(3*renew+renew/keepaliveRetries), s.KeepAt)

	// Kept again, after a failover (a new epoch) and with the database's
	// clock a second ahead: recovered, look for lost grants, a step.
	r = reply(4*renew, Reply{Alive: true, Epoch: 8})
	r.DBNow = r.DBNow.Add(time.Second)
	s.Answered(r, local)
	require.True(t, s.Trouble(), "failing until its owner reads the reply")
	v = s.Read(r, t0.Add(4*renew), renew, margin)
	require.False(t, s.Trouble())
	require.Equal(t, Kept, v.Outcome)
	require.True(t, v.Recovered && v.Look && v.FailedOver)
	require.Greater(t, v.Step, margin)

	// Gone: the database no longer has it.
	r = reply(5*renew, Reply{})
	require.Equal(t, Verdict{Outcome: Gone}, s.Read(r, t0.Add(5*renew), renew, margin))

	// Ended meanwhile: ignored; a failure is counted unless it was closed.
	trouble, ok := s.End(Dead)
	require.True(t, ok)
	require.False(t, trouble)
	_, ok = s.End(Closed)
	require.False(t, ok, "once")
	require.Equal(t, Verdict{Outcome: Ignore, Failed: true}, s.Read(failed, t0.Add(6*renew), renew, margin))
	c := New(2, 8, t0, db0.Add(time.Second), time.Second, local)
	stopped := false
	c.Sending(func() { stopped = true })
	trouble, ok = c.End(Closed)
	require.True(t, ok && stopped)
	require.False(t, trouble, "a closed session's leases did not fail renewal")
	require.Equal(t, Verdict{Outcome: Ignore}, c.Read(failed, t0, renew, margin))
}

func TestEndWhileKeepalivesFail(t *testing.T) {
	t0 := time.Now()
	s := New(1, 1, t0, t0.Add(time.Second), time.Second, 900*time.Millisecond)
	s.Failing.Store(true)
	trouble, ok := s.End(Dead)
	require.True(t, ok && trouble)
}

func TestLeaseDeadlineIsTheLaterWhileCarried(t *testing.T) {
	t0 := time.Now()
	db0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const margin = 100 * time.Millisecond
	s := New(1, 1, t0, db0.Add(time.Second), time.Second, 900*time.Millisecond)
	own, ownExp := t0.Add(500*time.Millisecond), db0.Add(600*time.Millisecond)
	require.Equal(t, s.Until(), s.Deadline(own, t0))
	require.Equal(t, s.Expires(), s.ExpiresAt(ownExp, t0))
	require.Equal(t, t0.Add(2*time.Second), s.Deadline(t0.Add(2*time.Second), t0), "its own is later")

	// Found passed while keep-alives failed: a renewal failure, unless
	// noticed too late.
	require.True(t, s.RenewFailure(own, true, s.Until().Add(margin/2), margin))
	require.False(t, s.RenewFailure(own, false, s.Until().Add(margin/2), margin))
	require.False(t, s.RenewFailure(own, true, s.Until().Add(margin), margin), "noticed a margin late: paused")

	// Ended, the session carries it no more: its own deadline alone.
	s.State.Store(Dead)
	require.Equal(t, own, s.Deadline(own, t0))
	require.Equal(t, ownExp, s.ExpiresAt(ownExp, t0))
}

func TestTiming(t *testing.T) {
	ttl, margin, renew := time.Duration(0), time.Duration(0), time.Duration(0)
	require.Empty(t, Timing(&ttl, &margin, &renew))
	require.Equal(t, []time.Duration{15 * time.Second, 1500 * time.Millisecond, 5 * time.Second}, []time.Duration{ttl, margin, renew})
	for _, c := range []struct {
		ttl, margin, renew time.Duration
		want               string
	}{
		{time.Microsecond, 0, 0, "TTL must be at least 1ms, got 1µs"},
		{time.Second, time.Second, 0, "SafetyMargin must be in [0, TTL), got 1s with TTL 1s"},
		{time.Second, -1, 0, "SafetyMargin must be in [0, TTL), got -1ns with TTL 1s"},
		{time.Second, 0, 900 * time.Millisecond, "RenewInterval must be positive and shorter than TTL - SafetyMargin (900ms), got 900ms"},
		{time.Second, 0, -1, "RenewInterval must be positive and shorter than TTL - SafetyMargin (900ms), got -1ns"},
	} {
		require.Equal(t, c.want, Timing(&c.ttl, &c.margin, &c.renew))
	}
}
