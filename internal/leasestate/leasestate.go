// Package leasestate is a lease's status: where it is in its life, its
// deadlines, and how it was given back.
//
// A lease's life moves only forward: Held, then perhaps HandedOff, then
// Released or Lost, which are final. A Status is a lease's state at one
// instant and is never changed once stored: a Cell holds the current one
// behind an atomic pointer, and Update replaces it whole with a changed
// copy, so that a lease needs no lock; Ctx is its context, made at the
// first use. What entering a state entails (closing Done, logging,
// metrics) is the lease's own business.
package leasestate

import (
	"fmt"
	"sync/atomic"
	"time"
)

// State is where a lease is in its life. It moves only forward, along
// transitions.
type State uint8

const (
	// Held: granted and kept alive. Done is open.
	Held State = iota
	// HandedOff: being completed in a caller's transaction (CompleteTx).
	// Done stays open so the transaction can commit under Context;
	// neither its deadline nor Close releases it: the keeper ends it when
	// it learns how the transaction ended (settle), or Close does.
	HandedOff
	// Released and Lost are final: Done is closed, with cause ErrReleased
	// or ErrLeaseLost (a loss is counted in the metrics).
	Released
	Lost

	numStates = iota // how many states there are
)

// transitions[from][to] are the allowed moves.
var transitions = [numStates][numStates]bool{
	Held:      {HandedOff: true, Released: true, Lost: true},
	HandedOff: {Released: true, Lost: true},
}

func (s State) String() string {
	switch s {
	case Held:
		return "held"
	case HandedOff:
		return "handed off"
	case Released:
		return "released"
	case Lost:
		return "lost"
	}
	return fmt.Sprintf("leaseState(%d)", uint8(s))
}

// Ended reports whether s is final: Done is closed.
func (s State) Ended() bool { return s == Released || s == Lost }

// Finish is how a lease was given back: the first call decides.
type Finish int8

const (
	NotFinished Finish = iota
	Release
	Complete
	CompleteTx
)

// Status is a lease's state at one instant. It is never changed in place:
// Update stores a changed copy.
type Status struct {
	State State
	Err   error // why it ended
	// ExpiresAt and Own are the grant's own expiry (database clock) and
	// local deadline (monotonic clock), moved only by Renew.
	ExpiresAt, Own time.Time
	// FinishedAs is the first of Release, Complete and CompleteTx, set
	// once (beginFinish); ReleaseErr is what the database answered it.
	FinishedAs Finish
	ReleaseErr error
	Recorded   bool // its end was recorded in the metrics
}

// Move moves s to state to, if transitions allows it: an end sets Err to
// cause, and a loss marks it Recorded (whoever moves it there records it).
func (s *Status) Move(to State, cause error) bool {
	if !transitions[s.State][to] {
		return false
	}
	s.State = to
	if to.Ended() {
		s.Err = cause
	}
	if to == Lost {
		s.Recorded = true
	}
	return true
}

// Finish records that the lease is given back as kind, unless it was
// before (the first call decides): it reports false then, and changes
// nothing. A lease not lost moves on (Finishing), released with cause
// released or handed off for CompleteTx, and moved says whether it did. A
// lease lost before stays lost: the item of a completion of it was not
// completed, and notCompleted(its loss) is the completion's ReleaseErr.
func (s *Status) Finish(kind Finish, released error, notCompleted func(lost error) error) (decided, moved bool) {
	if s.FinishedAs != NotFinished {
		return false, false
	}
	s.FinishedAs = kind
	if s.State == Lost && kind != Release {
		s.ReleaseErr = notCompleted(s.Err)
		return true, false
	}
	to, cause := Finishing(kind, released)
	return true, s.Move(to, cause)
}

// Finishing is the state a lease given back as kind moves to, and with
// what cause: handed off, still open, for CompleteTx; else released with
// cause released.
func Finishing(kind Finish, released error) (State, error) {
	if kind == CompleteTx {
		return HandedOff, nil
	}
	return Released, released
}

// Cell holds a lease's current Status. Its methods are safe for
// concurrent use.
type Cell struct {
	p atomic.Pointer[Status]
}

// Store sets the initial status, before c is shared.
func (c *Cell) Store(s *Status) { c.p.Store(s) }

// Load is the status now; the caller must not change it.
func (c *Cell) Load() *Status { return c.p.Load() }

// Update stores f's change to a copy of the status, unless f returns
// false; if the status changed meanwhile, f runs again. It returns the
// status f last saw and whether it stored one.
func (c *Cell) Update(f func(s *Status) bool) (old Status, changed bool) {
	for {
		cur := c.p.Load()
		next := *cur
		if !f(&next) {
			return *cur, false
		}
		if c.p.CompareAndSwap(cur, &next) {
			return *cur, true
		}
	}
}

// SetReleaseErr stores what the lease's give-back came to.
func (c *Cell) SetReleaseErr(err error) {
	c.Update(func(s *Status) bool { s.ReleaseErr = err; return true })
}

// Record marks the lease's end recorded in the metrics, and reports
// whether this call did: false when it was recorded before.
func (c *Cell) Record() bool {
	_, first := c.Update(func(s *Status) bool {
		if s.Recorded {
			return false
		}
		s.Recorded = true
		return true
	})
	return first
}

// Renewed moves the grant's own deadline to own and its expiry to expires
// after a renewal, unless the lease ended or a later renewal moved them
// further (renewals may overlap).
func (c *Cell) Renewed(own, expires time.Time) {
	c.Update(func(s *Status) bool {
		if s.State.Ended() || !own.After(s.Own) {
			return false
		}
		s.Own, s.ExpiresAt = own, expires
		return true
	})
}
