// Package giveback is a lease client's bookkeeping of what it has yet to
// settle with the database once the caller has moved on: the queue of
// grants to give back (Queue) and the schedule by which it asks how the
// transactions of CompleteTx completions ended (Schedule), and what the
// answer says (Settled).
//
// The package holds the decisions only: what is sent together, what stays
// queued after a failure, when to ask again. Sending the statements and
// what their replies do to a lease are leasetable's. Neither type is safe
// for concurrent use: their owner (the client's keeper goroutine)
// serialises every call. Leases are keys: comparable, such as pointers.
package giveback

import (
	"maps"
	"slices"
)

// Queue is the grants to give back: leases by their token (L) and
// requests whose grants are found by their id (R: its reply was lost, or
// its caller gave up). One give-back is on its way at a time and carries
// everything queued when it left; what fails stays queued until the
// owner sends again (leasetable: after the next successful keep-alive).
// The zero value is an empty queue.
type Queue[L, R comparable] struct {
	leases  map[L]struct{}
	refs    map[R]struct{}
	sending bool // a give-back is on its way
}

// Add queues leases to be given back by token.
func (q *Queue[L, R]) Add(leases ...L) {
	if q.leases == nil {
		q.leases = map[L]struct{}{}
	}
	for _, l := range leases {
		q.leases[l] = struct{}{}
	}
}

// AddRef queues a request whose grants are to be given back by its id.
func (q *Queue[L, R]) AddRef(r R) {
	if q.refs == nil {
		q.refs = map[R]struct{}{}
	}
	q.refs[r] = struct{}{}
}

// Send takes everything queued to send together, and marks a give-back on
// its way; ok is false, and nothing is taken, while one is on its way or
// when nothing is queued. What is taken stays queued until Sent.
func (q *Queue[L, R]) Send() (leases []L, refs []R, ok bool) {
	if q.sending || len(q.leases) == 0 && len(q.refs) == 0 {
		return nil, nil, false
	}
	q.sending = true
	leases, refs = q.All()
	return leases, refs, true
}

// Unsent is for a give-back taken by Send that could not start: nothing
// is on its way.
func (q *Queue[L, R]) Unsent() { q.sending = false }

// Sent applies the reply to the give-back of leases and refs taken by
// Send: the refs in gone were given back, and the leases too when
// leasesBack. It reports whether to send again at once, for what was
// queued meanwhile: only when all of it was given back.
func (q *Queue[L, R]) Sent(leases []L, leasesBack bool, refs, gone []R) (again bool) {
	q.sending = false
	for _, r := range gone {
		delete(q.refs, r)
	}
	if !leasesBack {
		return false
	}
	for _, l := range leases {
		delete(q.leases, l)
	}
	return len(gone) == len(refs)
}

// RefsPending reports whether requests are queued to be given back by id
// or a give-back (which may carry some) is on its way.
func (q *Queue[L, R]) RefsPending() bool { return len(q.refs) > 0 || q.sending }

// All returns everything queued, on its way too, in no order.
func (q *Queue[L, R]) All() (leases []L, refs []R) {
	return slices.Collect(maps.Keys(q.leases)), slices.Collect(maps.Keys(q.refs))
}
