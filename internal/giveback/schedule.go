package giveback

import (
	"maps"
	"slices"
	"time"

	"github.com/pgbaton/pgbaton/internal/db"
)

// SettleFirst is how soon the keeper first asks how a CompleteTx
// transaction ended; it asks less and less often while they stay open, up
// to once per RenewInterval.
const SettleFirst = 10 * time.Millisecond

// Schedule is the handed-off leases whose transaction's end is not known
// yet, and when to ask next how they ended, in one statement for all of
// them: SettleFirst after the first is added, then twice as long each
// time nothing settled, up to a bound, and SettleFirst again after
// something did. One ask is on its way at a time. The zero value is
// empty.
type Schedule[L comparable] struct {
	pending map[L]struct{}
	at      time.Time
	in      time.Duration
	asking  bool // an ask is on its way
}

// Add adds leases at now; added to an empty schedule, they are asked
// about SettleFirst later.
func (s *Schedule[L]) Add(now time.Time, leases ...L) {
	if len(s.pending) == 0 {
		s.in = SettleFirst
		s.at = now.Add(s.in)
	}
	if s.pending == nil {
		s.pending = map[L]struct{}{}
	}
	for _, l := range leases {
		s.pending[l] = struct{}{}
	}
}

// Next is when to ask next; ok is false while no lease is pending or an
// ask is on its way.
func (s *Schedule[L]) Next() (at time.Time, ok bool) {
	return s.at, len(s.pending) > 0 && !s.asking
}

// Ask returns the leases to ask about, and marks an ask on its way.
func (s *Schedule[L]) Ask() []L {
	s.asking = true
	return slices.Collect(maps.Keys(s.pending))
}

// Unasked is for an ask that could not start: nothing is on its way.
func (s *Schedule[L]) Unasked() { s.asking = false }

// Answered applies, at now, the answer to the ask of asked: the leases
// that ended are dropped; settled is whether any transaction had ended,
// and most bounds the interval.
func (s *Schedule[L]) Answered(now time.Time, asked []L, ended func(L) bool, settled bool, most time.Duration) {
	s.asking = false
	for _, l := range asked {
		if ended(l) {
			delete(s.pending, l)
		}
	}
	if settled {
		s.in = SettleFirst
	} else {
		s.in = min(2*s.in, most)
	}
	s.at = now.Add(s.in)
}

// Settled reads the answer to an ask about asked, each name's state as
// pgbaton.lease_settle_many gives it ("gone": its transaction committed;
// "released": it rolled back; else still open), and calls each, in
// order, for every lease whose transaction ended. It reports whether any
// had: the settled of Answered.
func Settled[L interface{ Name() string }](asked []L, rows []db.LeaseSettleManyRow, each func(l L, committed bool)) bool {
	state := make(map[string]string, len(rows))
	for _, r := range rows {
		state[r.Name] = r.State
	}
	settled := false
	for _, l := range asked {
		switch state[l.Name()] {
		case "gone":
			each(l, true)
		case "released":
			each(l, false)
		default:
			continue
		}
		settled = true
	}
	return settled
}
