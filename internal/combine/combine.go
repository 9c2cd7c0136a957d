// Package combine is the queue by which a lease client sends concurrent
// CompleteAndClaim calls of one group together: one round trip and one
// transaction complete every caller's finished leases and claim the sum
// of their counts, and each caller gets its own share of the claimed
// leases. Up to Senders round trips of a group are in flight at once; the
// calls that arrive meanwhile wait to go together in the next, up to Max
// leases claimed in all; once that many wait, another round trip goes at
// once, beside the others. A call that finds a sender free is sent at
// once, so a lone worker waits for nothing. This is what River's
// completer does for its workers: at batch 1, a commit per item made 4
// workers slower than River on a server whose commits are slow
// (TestConcurrentCompleteAndClaimShareARoundTrip in leasetable). Large
// calls are not held back: with one round trip at a time, 4 workers
// claiming 100 each ran their statements one after another on one server
// core, where raw pgx runs four at once
// (TestLargeCompleteAndClaimCallsOverlap).
//
// The package holds the bookkeeping (which caller becomes a sender, which
// calls go together, when a group is forgotten, how the claimed leases are
// shared out) and the senders' loop (Sender). The round trip itself, and
// the queue's owner, are leasetable's.
package combine

// Max is how many leases the calls sent together claim at most: past it,
// a commit per round trip is a small part of the statement's cost, and
// the calls gain more from running beside each other.
const Max = 100

// Senders is how many round trips of a group are in flight at once
// (unless Max leases wait): one left a server core idle while it was on
// the wire. 4 workers on a 2-core AMD EPYC host, two interleaved rounds
// of 5 runs, pgbaton ÷ raw pgx with one and with two: batch 1, 0.96-0.97
// and 1.36-1.44; batch 10, 0.87-1.02 and 0.99-1.14; batch 10 with 1M
// items queued, 0.68-0.76 and 1.01-1.23
// (TestSmallCompleteAndClaimCallsOverlap).
const Senders = 2

// Queue is the calls queued per key (a group), each with its weight (the
// leases it claims), and the senders running per key. The zero value is
// an empty queue. Not safe for concurrent use: its owner (the client's
// keeper goroutine) serialises every call.
type Queue[C any] struct {
	pending map[string][]weighted[C] // by key
	sending map[string]int           // senders running, by key
}

// weighted is a call queued with its weight.
type weighted[C any] struct {
	call   C
	weight int
}

// Add queues call for key and reports whether its caller starts a
// sender's turn: when fewer than Senders senders run for key, or the
// calls queued weigh Max or more.
func (q *Queue[C]) Add(key string, call C, weight int) (startSender bool) {
	if q.pending == nil {
		q.pending, q.sending = map[string][]weighted[C]{}, map[string]int{}
	}
	q.pending[key] = append(q.pending[key], weighted[C]{call, weight})
	queued := 0
	for _, w := range q.pending[key] {
		queued += w.weight
	}
	start := q.sending[key] < Senders || queued >= Max
	if start {
		q.sending[key]++
	}
	return start
}

// Take takes the calls queued for key, the first and then as many as
// weigh Max in all, or, when none is left, ends the caller's turn as a
// sender of key and returns nil.
func (q *Queue[C]) Take(key string) []C {
	if q.Idle(key) {
		return nil
	}
	p := q.pending[key]
	n, sum := 0, 0
	for n < len(p) && (n == 0 || sum+p[n].weight <= Max) {
		sum += p[n].weight
		n++
	}
	take := make([]C, n)
	for i, w := range p[:n] {
		take[i] = w.call
	}
	q.pending[key] = p[n:]
	return take
}

// Idle ends a sender's turn, and reports true, when no call is queued for
// key; the key is forgotten with its last sender. When calls are queued
// it reports false, and the sender keeps its turn.
func (q *Queue[C]) Idle(key string) bool {
	if len(q.pending[key]) > 0 {
		return false
	}
	if q.sending[key]--; q.sending[key] == 0 {
		delete(q.pending, key)
		delete(q.sending, key)
	}
	return true
}

// Pending is how many calls are queued for key.
func (q *Queue[C]) Pending(key string) int { return len(q.pending[key]) }

// All returns every call queued, of every key, in no order between keys.
func (q *Queue[C]) All() []C {
	var all []C
	for _, p := range q.pending {
		for _, w := range p {
			all = append(all, w.call)
		}
	}
	return all
}

// Sender sends the calls of a Queue whose owner is a mailbox's goroutine
// (K): every change of the queue runs there, by Ask or Post. Made once per
// client, so that a call costs no more than the messages it sends: a call
// that sends a round trip itself asks the owner once (to queue it and take
// what goes with it) and posts once (to end its turn), where each Ask is
// a round trip between goroutines its caller waits for.
type Sender[K, C any] struct {
	// Ask runs f on the owner and reports whether it ran: false once the
	// owner stopped (the client closed).
	Ask func(f func(K)) bool
	// Post has f run on the owner without waiting for it, unless the
	// owner stopped.
	Post func(f func(K)) bool
	// Spawn runs f on a goroutine of its own, unless the owner stopped.
	Spawn func(f func()) bool
	// Queue is the owner's queue.
	Queue func(K) *Queue[C]
	// Send sends calls of key in one round trip and hands each its part
	// of the reply.
	Send func(key string, calls []C)
}

// Join queues call for key, weighing weight. When its caller starts a
// sender's turn (Add), it sends a round trip itself (call is among those
// taken, waits for the next, or went with another sender's), then leaves
// what is queued to a sender of its own: a caller waits for one round
// trip at most. It reports false, and nothing was queued, when the owner
// stopped; calls queued then are the owner's to fail (All).
func (s *Sender[K, C]) Join(key string, call C, weight int) bool {
	var calls []C
	if !s.Ask(func(k K) {
		if q := s.Queue(k); q.Add(key, call, weight) {
			calls = q.Take(key) // not nil: call is queued
		}
	}) {
		return false
	}
	if calls == nil {
		return true
	}
	s.Send(key, calls)
	// The turn ends on the owner, or goes on in a sender of its own when
	// calls came meanwhile; the caller need not wait for either.
	s.Post(func(k K) {
		if !s.Queue(k).Idle(key) {
			s.Spawn(func() { s.sendAll(key) })
		}
	})
	return true
}

// take takes the calls queued for key (Take), or, when none is left or
// the owner stopped, ends the caller's turn as a sender of key and
// returns nil.
func (s *Sender[K, C]) take(key string) (take []C) {
	s.Ask(func(k K) { take = s.Queue(k).Take(key) })
	return take
}

// sendAll sends the queued calls of key, a round trip at a time, until
// none is left.
func (s *Sender[K, C]) sendAll(key string) {
	for calls := s.take(key); calls != nil; calls = s.take(key) {
		s.Send(key, calls)
	}
}

// Share cuts what one of the calls sent together gets, the first n of
// rows (fewer when fewer are left), from the rest, in the order the calls
// were taken. The share's capacity ends at its length, so that a caller
// appending to it does not write over the next caller's share.
func Share[R any](rows []R, n int) (share, rest []R) {
	n = min(n, len(rows))
	return rows[:n:n], rows[n:]
}
