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

// TestFinishFirstCallDecides: the first Finish decides how a lease is
// given back and moves it on; later ones change nothing.
func TestFinishFirstCallDecides(t *testing.T) {
	released := errors.New("released")
	notCompleted := func(lost error) error { t.Fatal("a held lease was taken for lost"); return nil }
	for _, c := range []struct {
		kind Finish
		to   State
		err  error
	}{{Release, Released, released}, {Complete, Released, released}, {CompleteTx, HandedOff, nil}} {
		s := Status{}
		decided, moved := s.Finish(c.kind, released, notCompleted)
		require.True(t, decided)
		require.True(t, moved)
		require.Equal(t, c.to, s.State)
		require.Equal(t, c.err, s.Err)
		require.Equal(t, c.kind, s.FinishedAs)
		to, cause := Finishing(c.kind, released)
		require.Equal(t, c.to, to)
		require.Equal(t, c.err, cause)

		before := s
		decided, moved = s.Finish(Release, released, notCompleted)
		require.False(t, decided)
		require.False(t, moved)
		require.Equal(t, before, s)
	}
	// Handed off, then released after the transaction: not moved again.
	s := Status{State: HandedOff}
	decided, moved := s.Finish(Release, released, notCompleted)
	require.True(t, decided)
	require.True(t, moved)
	require.Equal(t, Released, s.State)
}

// TestFinishLostBefore: a lease lost before stays lost; a completion of
// it gets notCompleted of the loss, a release nothing.
func TestFinishLostBefore(t *testing.T) {
	lostErr, notErr := errors.New("lost"), errors.New("not completed")
	for _, kind := range []Finish{Complete, CompleteTx} {
		s := Status{State: Lost, Err: lostErr, Recorded: true}
		var got error
		decided, moved := s.Finish(kind, nil, func(lost error) error { got = lost; return notErr })
		require.True(t, decided)
		require.False(t, moved)
		require.Equal(t, lostErr, got)
		require.Equal(t, Lost, s.State)
		require.Equal(t, lostErr, s.Err)
		require.Equal(t, notErr, s.ReleaseErr)
		require.Equal(t, kind, s.FinishedAs)
	}
	s := Status{State: Lost, Err: lostErr}
	decided, moved := s.Finish(Release, nil, func(error) error { t.Fatal("a release was told not completed"); return nil })
	require.True(t, decided)
	require.False(t, moved)
	require.Nil(t, s.ReleaseErr)
	require.Equal(t, Release, s.FinishedAs)
}

// An end is recorded once; a renewal only moves the deadline forward, and
// not after the end.
func TestCellBookkeeping(t *testing.T) {
	var c Cell
	t0 := time.Now()
	c.Store(&Status{Own: t0})
	require.True(t, c.Record())
	require.False(t, c.Record())

	c.Renewed(t0.Add(time.Second), t0.Add(2*time.Second))
	c.Renewed(t0.Add(time.Millisecond), t0) // an older renewal, answered late
	require.Equal(t, t0.Add(time.Second), c.Load().Own)
	require.Equal(t, t0.Add(2*time.Second), c.Load().ExpiresAt)

	errRelease := errors.New("release failed")
	c.SetReleaseErr(errRelease)
	require.Equal(t, errRelease, c.Load().ReleaseErr)

	c.Update(func(s *Status) bool { return s.Move(Lost, errors.New("lost")) })
	c.Renewed(t0.Add(time.Hour), t0.Add(time.Hour))
	require.Equal(t, t0.Add(time.Second), c.Load().Own, "renewed after the end")
}
