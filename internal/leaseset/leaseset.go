// Package leaseset is the set of leases a lease client's keeper keeps:
// those its current session carries (held by the session's keep-alives)
// and the loose ones, held by their own deadline once the session they
// were granted in ended, as in the database.
//
// The package holds the bookkeeping only: which set a lease is in, when
// the ended ones are dropped, which loose lease's deadline is next. Ending
// a lease, and what its end entails, is leasetable's (the expire callback
// of Due). A Set is not safe for concurrent use: its owner (the client's
// keeper goroutine) serialises every call. Leases are keys: comparable,
// such as pointers; the Set reads their state through the function given
// to New.
package leaseset

import (
	"iter"
	"slices"
	"time"

	"github.com/pgbaton/pgbaton/internal/leasestate"
)

// Set is the leases a keeper keeps.
type Set[L comparable] struct {
	status func(L) *leasestate.Status
	// carried by the current session, in the order granted: a slice, not
	// a map, as each lease is added once and only pruning takes leases
	// out. Adding to a map was most of the keeper's CPU claiming batches
	// of 100 (bench profile); BenchmarkAddAndPrune: 4.5-4.9 µs a batch
	// against 9.9-10.5 with the map.
	carried []L
	loose   map[L]struct{} // held by their own deadline: their session ended
	pruneAt int            // len(carried) at which Add prunes it next
	// oldest is the earliest own deadline of the leases carried (zero:
	// none), as of the last prune and the adds since: never later than
	// that of the live ones (a lease ended or renewed since only leaves it
	// early), and kept without a pass over them at each grant.
	oldest time.Time
}

// New returns an empty Set whose leases' states status reads.
func New[L comparable](status func(L) *leasestate.Status) *Set[L] {
	return &Set[L]{status: status, loose: map[L]struct{}{}}
}

// Add keeps leases granted in one round trip: carried by the session when
// carried says so; else loose (its session ended between the grant and
// now: it holds by its own deadline, as in the database).
func (s *Set[L]) Add(carried func(L) bool, leases ...L) {
	for _, l := range leases {
		if carried(l) {
			s.carried = append(s.carried, l)
			s.noteOwn(l)
		} else {
			s.loose[l] = struct{}{}
		}
	}
	if len(s.carried) >= max(s.pruneAt, PruneMin) {
		s.prune()
		s.pruneAt = 2 * len(s.carried)
	}
}

// PruneMin is how many leases carried grows to before Add drops the ended
// ones; past it, Add drops them each time carried has doubled since, so
// that carried stays within about twice what is live at a cost per grant
// that does not grow with it. Dropped only at keep-alives (every TTL/3), a
// worker completing 80k items/s grew carried to ~400k entries that each
// grant added to and the garbage collector scanned.
const PruneMin = 1024

// Carried counts the leases the session carries, ended ones not dropped
// yet included.
func (s *Set[L]) Carried() int { return len(s.carried) }

// Live drops the ended leases from those the session carries and returns
// those left.
func (s *Set[L]) Live() []L {
	s.prune()
	return slices.Clone(s.carried)
}

// Oldest is the earliest own deadline of the leases carried (zero: none):
// the session must be kept alive for them from a renew interval after the
// oldest one was granted. exact drops the ended ones first, which costs a
// pass over them; otherwise it may be earlier than that of the live ones,
// never later.
func (s *Set[L]) Oldest(exact bool) time.Time {
	if exact {
		s.prune()
	}
	return s.oldest
}

// prune drops the ended leases from those carried.
func (s *Set[L]) prune() {
	s.carried = slices.DeleteFunc(s.carried, func(l L) bool { return s.status(l).State.Ended() })
	s.oldest = time.Time{}
	for _, l := range s.carried {
		s.noteOwn(l)
	}
}

// noteOwn lowers oldest to l's own deadline if earlier.
func (s *Set[L]) noteOwn(l L) {
	if own := s.status(l).Own; s.oldest.IsZero() || own.Before(s.oldest) {
		s.oldest = own
	}
}

// Loosen is the end of the session: every live lease it carried is held
// by its own deadline from now on. It returns how many it carried, and
// those held whose own deadline has passed at now, for the owner to end
// (they are no longer kept); the others are kept loose.
func (s *Set[L]) Loosen(now time.Time) (n int, passed []L) {
	leases := s.Live()
	clear(s.carried) // no pointers kept past the end for the collector
	s.carried = s.carried[:0]
	s.oldest = time.Time{}
	for _, l := range leases {
		if st := s.status(l); st.State == leasestate.Held && !now.Before(st.Own) {
			passed = append(passed, l)
		} else {
			s.loose[l] = struct{}{}
		}
	}
	return len(leases), passed
}

// Due drops the loose leases that ended, ends (expire) and drops those
// held whose own deadline passed at now, and returns the earliest own
// deadline of those left held (ok false: none).
func (s *Set[L]) Due(now time.Time, expire func(L)) (next time.Time, ok bool) {
	for l := range s.loose {
		st := s.status(l)
		switch {
		case st.State.Ended():
			delete(s.loose, l)
		case st.State == leasestate.Held && !now.Before(st.Own):
			expire(l)
			delete(s.loose, l)
		case st.State == leasestate.Held:
			if !ok || st.Own.Before(next) {
				next, ok = st.Own, true
			}
		}
	}
	return next, ok
}

// Open returns the leases kept that have not ended: those held, and those
// handed off to a completion in a transaction.
func (s *Set[L]) Open() (held, handed []L) {
	for l := range s.All() {
		switch s.status(l).State {
		case leasestate.Held:
			held = append(held, l)
		case leasestate.HandedOff:
			handed = append(handed, l)
		}
	}
	return held, handed
}

// All yields every lease kept, carried or loose, ended ones not dropped
// yet included.
func (s *Set[L]) All() iter.Seq[L] {
	return func(yield func(L) bool) {
		for _, l := range s.carried {
			if !yield(l) {
				return
			}
		}
		for l := range s.loose {
			if !yield(l) {
				return
			}
		}
	}
}
