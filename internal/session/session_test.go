package session

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestIdleAfterAWholeTTLUnused(t *testing.T) {
	t0 := time.Now()
	s := New(1, 1, t0, t0.Add(time.Second), time.Second, 900*time.Millisecond)
	ttl := time.Second
	require.False(t, s.Idle(false, t0.Add(ttl/2), ttl), "unused since it opened, for half a TTL")
	require.True(t, s.Idle(false, t0.Add(ttl), ttl), "unused since it opened, for a TTL")
	require.False(t, s.Idle(true, t0.Add(2*ttl), ttl), "busy")
	require.False(t, s.Idle(false, t0.Add(3*ttl), ttl), "the first look after a busy one starts the count")
	require.False(t, s.Idle(false, t0.Add(4*ttl-time.Millisecond), ttl))
	require.True(t, s.Idle(false, t0.Add(4*ttl), ttl))
}

// A session a grant took between two looks is not idle at the second,
// though the look finds nothing in use; the count starts at the first look
// after the last use.
func TestUsedBetweenLooksIsNotIdle(t *testing.T) {
	t0 := time.Now()
	s := New(1, 1, t0, t0.Add(time.Second), time.Second, 900*time.Millisecond)
	ttl := time.Second
	s.Use()
	require.False(t, s.Idle(false, t0.Add(ttl), ttl), "used since it opened")
	require.False(t, s.Idle(false, t0.Add(2*ttl), ttl), "the first look after the use starts the count")
	s.Use()
	require.False(t, s.Idle(false, t0.Add(3*ttl), ttl), "used since the last look")
	require.False(t, s.Idle(false, t0.Add(4*ttl-time.Millisecond), ttl))
	require.False(t, s.Idle(false, t0.Add(4*ttl), ttl), "a TTL since the look that started the count, not since the use")
	require.True(t, s.Idle(false, t0.Add(5*ttl), ttl))
}

func TestClockStepIsWhatTheDatabaseClockMovedBeyondOurs(t *testing.T) {
	t0 := time.Now()
	db0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := New(1, 1, t0, db0.Add(10*time.Second), 10*time.Second, 9*time.Second)
	// A keep-alive sent at 1s, answered at 1.2s, ran at the database's
	// 1.1s: no step (the round trip counts on our side).
	require.Equal(t, -100*time.Millisecond, s.ClockStep(t0.Add(time.Second), t0.Add(1200*time.Millisecond), db0.Add(1100*time.Millisecond)))
	// The next ran 30s later by the database's clock, 2s later by ours: a
	// 28s step less the round trip counted from the earlier send.
	step := s.ClockStep(t0.Add(3*time.Second), t0.Add(3200*time.Millisecond), db0.Add(31100*time.Millisecond))
	require.Equal(t, 30*time.Second-2200*time.Millisecond, step)
}

func TestExtendOnlyMovesForward(t *testing.T) {
	t0 := time.Now()
	s := New(1, 1, t0, t0.Add(time.Second), time.Second, 900*time.Millisecond)
	require.Equal(t, t0.Add(900*time.Millisecond), s.Until())
	s.Extend(t0.Add(time.Second), t0.Add(2*time.Second), 900*time.Millisecond)
	require.Equal(t, t0.Add(1900*time.Millisecond), s.Until())
	s.Extend(t0.Add(500*time.Millisecond), t0.Add(3*time.Second), 900*time.Millisecond)
	require.Equal(t, t0.Add(1900*time.Millisecond), s.Until(), "an older keep-alive's reply")
	require.True(t, s.Carries(t0.Add(1899*time.Millisecond)))
	require.False(t, s.Carries(t0.Add(1900*time.Millisecond)))
	s.State.Store(Dead)
	require.False(t, s.Carries(t0))
}

type overdueLease struct {
	name     string
	deadline time.Time
}

func (l overdueLease) Name() string        { return l.name }
func (l overdueLease) Token() int64        { return 7 }
func (l overdueLease) Deadline() time.Time { return l.deadline }

// Leases are overdue once the last keep-alive is a renew interval and a
// half old; at most 5 are named.
func TestOverdue(t *testing.T) {
	t0 := time.Now()
	s := New(1, 1, t0, t0.Add(time.Second), time.Second, 900*time.Millisecond)
	var leases []overdueLease
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		leases = append(leases, overdueLease{n, t0.Add(900 * time.Millisecond)})
	}
	read := func() []overdueLease { return leases }
	n, out := Overdue(s, read, 300*time.Millisecond, t0.Add(450*time.Millisecond))
	require.Zero(t, n, "kept alive a renew interval and a half ago")
	require.Empty(t, out)
	n, out = Overdue(s, read, 300*time.Millisecond, t0.Add(500*time.Millisecond))
	require.Equal(t, 7, n)
	require.Equal(t, []string{`"a" token 7 (last kept alive 500ms ago, lost in 400ms)`, `"b" token 7 (last kept alive 500ms ago, lost in 400ms)`,
		`"c" token 7 (last kept alive 500ms ago, lost in 400ms)`, `"d" token 7 (last kept alive 500ms ago, lost in 400ms)`,
		`"e" token 7 (last kept alive 500ms ago, lost in 400ms)`, "and 2 more"}, out)
}
