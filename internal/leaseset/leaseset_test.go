package leaseset

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/leasestate"
)

// lease is a test lease: its status, by pointer.
type lease struct{ st leasestate.Status }

func newSet() *Set[*lease] { return New(func(l *lease) *leasestate.Status { return &l.st }) }

func held(own time.Time) *lease {
	return &lease{st: leasestate.Status{State: leasestate.Held, Own: own}}
}

func collect(s *Set[*lease]) []*lease { return slices.Collect(s.All()) }

func TestAddCarriedOrLoose(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := newSet()
	a, b := held(t0.Add(time.Second)), held(t0.Add(2*time.Second))
	s.Add(func(l *lease) bool { return l == a }, a, b)
	require.Equal(t, 1, s.Carried())
	require.Equal(t, []*lease{a}, s.Live())
	require.ElementsMatch(t, []*lease{a, b}, collect(s))

	// The loose one is ended at its own deadline, not before; the
	// carried one is the session's.
	var expired []*lease
	expire := func(l *lease) { expired = append(expired, l) }
	next, ok := s.Due(t0, expire)
	require.True(t, ok)
	require.Equal(t, b.st.Own, next)
	require.Empty(t, expired)
	_, ok = s.Due(b.st.Own, expire)
	require.False(t, ok)
	require.Equal(t, []*lease{b}, expired)
	require.Equal(t, []*lease{a}, collect(s), "the expired loose lease is dropped")
}

func TestLoosenAtTheSessionsEnd(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := newSet()
	past, later, handed, ended := held(t0), held(t0.Add(time.Second)), held(t0), held(t0.Add(time.Second))
	handed.st.State = leasestate.HandedOff
	ended.st.State = leasestate.Released
	s.Add(func(*lease) bool { return true }, past, later, handed, ended)

	n, passed := s.Loosen(t0)
	require.Equal(t, 3, n, "the live ones it carried")
	require.Equal(t, []*lease{past}, passed, "held with its own deadline passed: the owner ends it")
	require.Zero(t, s.Carried())
	require.ElementsMatch(t, []*lease{later, handed}, collect(s), "held by their own deadline, or settled by their transaction")

	// Due drops the loose ones once ended, and wakes for the held one.
	handed.st.State = leasestate.Released
	next, ok := s.Due(t0, func(*lease) { t.Fatal("expired early") })
	require.True(t, ok)
	require.Equal(t, later.st.Own, next)
	require.Equal(t, []*lease{later}, collect(s))
}

func TestAddPrunesEndedLeasesAsCarriedDoubles(t *testing.T) {
	s := newSet()
	carried := func(*lease) bool { return true }
	var all []*lease
	for range PruneMin - 1 {
		l := held(time.Time{})
		l.st.State = leasestate.Released
		all = append(all, l)
	}
	s.Add(carried, all...)
	require.Equal(t, PruneMin-1, s.Carried(), "below PruneMin nothing is dropped")
	live := held(time.Time{})
	s.Add(carried, live)
	require.Equal(t, 1, s.Carried(), "at PruneMin the ended ones are dropped")

	// Next when carried reached max(PruneMin, twice what was left).
	l := held(time.Time{})
	s.Add(carried, l)
	l.st.State = leasestate.Lost
	for range PruneMin - 3 {
		s.Add(carried, held(time.Time{}))
	}
	require.Equal(t, PruneMin-1, s.Carried())
	s.Add(carried, held(time.Time{}))
	require.Equal(t, PruneMin-1, s.Carried(), "carried reached PruneMin again: the lost one is dropped")
	require.Len(t, s.Live(), PruneMin-1)
}

// Open leaves out the ended leases, carried or loose.
func TestOpenByState(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := newSet()
	a, b, handed, ended := held(t0), held(t0), held(t0), held(t0)
	handed.st.State, ended.st.State = leasestate.HandedOff, leasestate.Released
	s.Add(func(l *lease) bool { return l != b }, a, b, handed, ended)
	h, off := s.Open()
	require.ElementsMatch(t, []*lease{a, b}, h)
	require.Equal(t, []*lease{handed}, off)
}

// BenchmarkAddAndPrune is a keeper's work per lease of a worker claiming
// batches of 100 and completing each before the next: Add, and the
// pruning of the ended ones that it triggers.
func BenchmarkAddAndPrune(b *testing.B) {
	s := newSet()
	carried := func(*lease) bool { return true }
	batch := make([]*lease, 100)
	for b.Loop() {
		for i := range batch {
			batch[i] = &lease{st: leasestate.Status{State: leasestate.Held}}
		}
		s.Add(carried, batch...)
		for _, l := range batch {
			l.st.State = leasestate.Released
		}
	}
}

// TestOldestOwnDeadline: Oldest never says later than the live leases'
// earliest own deadline, and exactly that after a prune.
func TestOldestOwnDeadline(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := newSet()
	require.True(t, s.Oldest(true).IsZero(), "none carried")
	a, b, c := held(t0.Add(2*time.Second)), held(t0.Add(time.Second)), held(t0.Add(3*time.Second))
	s.Add(func(*lease) bool { return true }, a, b)
	s.Add(func(l *lease) bool { return l != c }, c) // loose: not the session's
	require.Equal(t, b.st.Own, s.Oldest(false))

	b.st.State = leasestate.Released
	require.Equal(t, b.st.Own, s.Oldest(false), "early until pruned")
	require.Equal(t, a.st.Own, s.Oldest(true))

	s.Loosen(t0)
	require.True(t, s.Oldest(false).IsZero(), "the session ended")
}
