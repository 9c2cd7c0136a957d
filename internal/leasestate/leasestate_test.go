package leasestate

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The lease's life only moves forward: no state is entered twice, and
// released and lost are final.
func TestTransitions(t *testing.T) {
	allowed := map[[2]State]bool{
		{Held, HandedOff}:     true,
		{Held, Released}:      true,
		{Held, Lost}:          true,
		{HandedOff, Released}: true,
		{HandedOff, Lost}:     true,
	}
	for from := range State(numStates) {
		for to := range State(numStates) {
			if got, want := transitions[from][to], allowed[[2]State{from, to}]; got != want {
				t.Errorf("%s -> %s allowed: %v, want %v", from, to, got, want)
			}
			s := Status{State: from}
			if moved := s.Move(to, errors.New("cause")); moved != allowed[[2]State{from, to}] {
				t.Errorf("%s -> %s moved: %v", from, to, moved)
			} else if !moved && s != (Status{State: from}) {
				t.Errorf("%s -> %s refused but changed the status: %+v", from, to, s)
			}
		}
		if final := from == Released || from == Lost; from.Ended() != final {
			t.Errorf("%s ended: %v, want %v", from, from.Ended(), final)
		}
	}
}

// Move sets Err only on an end, and Recorded only on a loss.
func TestMoveSetsErrAndRecorded(t *testing.T) {
	cause := errors.New("cause")
	for _, tc := range []struct {
		to       State
		err      error
		recorded bool
	}{
		{HandedOff, nil, false},
		{Released, cause, false},
		{Lost, cause, true},
	} {
		s := Status{}
		require.True(t, s.Move(tc.to, cause), tc.to)
		require.Equal(t, tc.to, s.State)
		require.Equal(t, tc.err, s.Err, tc.to)
		require.Equal(t, tc.recorded, s.Recorded, tc.to)
	}
}

// Update stores a copy: a status loaded before stays as it was; f
// returning false stores nothing.
func TestUpdateReplacesWhole(t *testing.T) {
	var c Cell
	c.Store(&Status{})
	before := c.Load()
	old, changed := c.Update(func(s *Status) bool { return s.Move(Lost, errors.New("lost")) })
	require.True(t, changed)
	require.Equal(t, Held, old.State)
	require.Equal(t, Held, before.State, "a loaded status changed in place")
	require.Equal(t, Lost, c.Load().State)

	cur := c.Load()
	old, changed = c.Update(func(s *Status) bool { return s.Move(Released, nil) })
	require.False(t, changed)
	require.Equal(t, *cur, old)
	require.Same(t, cur, c.Load())
}

// When another Update stored meanwhile, f runs again on the new status,
// and neither change is lost.
func TestUpdateRetriesWhenRaced(t *testing.T) {
	var c Cell
	c.Store(&Status{})
	calls := 0
	old, changed := c.Update(func(s *Status) bool {
		calls++
		if calls == 1 {
			c.Update(func(s *Status) bool { s.Recorded = true; return true })
		}
		s.FinishedAs = Complete
		return true
	})
	require.True(t, changed)
	require.Equal(t, 2, calls)
	require.True(t, old.Recorded, "f last saw the status before the racing update")
	require.Equal(t, Status{FinishedAs: Complete, Recorded: true}, *c.Load())
}

// Concurrent Updates lose none of each other's changes (run with -race).
func TestUpdateConcurrent(t *testing.T) {
	const goroutines, n = 2, 1000
	var c Cell
	base := time.Unix(0, 0)
	c.Store(&Status{Own: base})
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n {
				c.Update(func(s *Status) bool { s.Own = s.Own.Add(time.Nanosecond); return true })
			}
		}()
	}
	wg.Wait()
	require.Equal(t, time.Duration(goroutines*n), c.Load().Own.Sub(base))
}
