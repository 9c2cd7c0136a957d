package test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/pgbaton/pgbaton/test/check"
)

// TestTakeoversExcuseOnlyChainedFaults: the liveness checker restarts its
// count at a later fault only when that fault struck before the grant and
// within the bound of the one before it.
func TestTakeoversExcuseOnlyChainedFaults(t *testing.T) {
	const bound = 5 * time.Second
	s := func(d time.Duration) int64 { return int64(d) }
	kill := fault{Kind: faultKill, Key: "k", At: 0, Healed: 0}
	grant := func(at time.Duration) check.Grant { return check.Grant{Key: "k", Start: s(at)} }

	// Alone, a kill followed by a grant after the bound is late.
	got := takeovers([]fault{kill}, []check.Grant{grant(bound + time.Second)}, bound, false)
	assert.True(t, got[0].late(bound))
	assert.Equal(t, bound+time.Second, got[0].took)

	// A pause of another worker (the next in line) 2s later restarts the
	// count: the grant 3.5s after that pause is in time.
	pause := fault{Kind: faultPause, Key: "", At: s(2 * time.Second), Healed: s(6 * time.Second)}
	got = takeovers([]fault{kill, pause}, []check.Grant{grant(5500 * time.Millisecond)}, bound, false)
	assert.False(t, got[0].late(bound), "%+v", got[0])
	assert.Equal(t, 2*time.Second, got[0].excused)

	// A fault after the grant excuses nothing.
	got = takeovers([]fault{kill, {Kind: faultCut, At: s(7 * time.Second), Healed: s(7 * time.Second)}},
		[]check.Grant{grant(6 * time.Second)}, bound, false)
	assert.True(t, got[0].late(bound))
	assert.Zero(t, got[0].excused)

	// Nor does one that came later than the bound: the grant was due.
	stuck := []fault{kill, {Kind: faultCut, At: s(bound + time.Second), Healed: s(bound + time.Second)}}
	got = takeovers(stuck, []check.Grant{grant(bound + 2*time.Second)}, bound, false)
	assert.True(t, got[0].late(bound))

	// A chain of faults, each within the bound of the one before, is
	// counted from its last one.
	chain := []fault{kill,
		{Kind: faultKill, At: s(3 * time.Second), Healed: s(3 * time.Second)},
		{Kind: faultKill, At: s(7 * time.Second), Healed: s(7 * time.Second)}}
	got = takeovers(chain, []check.Grant{grant(10 * time.Second)}, bound, false)
	assert.False(t, got[0].late(bound), "%+v", got[0])
	assert.Equal(t, 7*time.Second, got[0].excused)

	// No grant at all is reported as such.
	got = takeovers([]fault{kill}, nil, bound, false)
	assert.Equal(t, time.Duration(-1), got[0].took)
	assert.True(t, got[0].late(bound))

	// A grant of another key does not end the wait.
	got = takeovers([]fault{kill}, []check.Grant{{Key: "other", Start: s(time.Second)}}, bound, false)
	assert.Equal(t, time.Duration(-1), got[0].took)
}
