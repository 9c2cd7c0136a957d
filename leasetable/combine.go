package leasetable

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// Concurrent CompleteAndClaim calls of one client on one group are sent
// together: one round trip and one transaction complete every caller's
// finished leases and claim the sum of their counts, and each caller gets
// its own share of the claimed leases. While a round trip of the group is
// in flight, the calls that arrive wait to go together in the next, up to
// combineMax leases claimed in all; once that many wait, another round
// trip goes at once, beside the first. A call that finds none in flight
// is sent at once, so a lone worker waits for nothing. This is what
// River's completer does for its workers: at batch 1, a commit per item
// made 4 workers slower than River on a server whose commits are slow
// (TestConcurrentCompleteAndClaimShareARoundTrip). Large calls are not
// held back: with one round trip at a time, 4 workers claiming 100 each
// ran their statements one after another on one server core, where raw
// pgx runs four at once (TestLargeCompleteAndClaimCallsOverlap).
//
// A caller whose context ends while its call is queued or on the wire
// returns at once; when the reply comes, its finished leases are settled
// from it and its share of the claim is given back, as inFlight does for
// a lone call.

// combined is one CompleteAndClaim call waiting for its round trip.
type combined struct {
	cb   *completion
	n    int
	done chan combinedReply // buffered: the sender never blocks on it

	// taken: the turn to decide who reads the reply, taken by the sender
	// once the reply is in done or by the caller giving up (as in
	// inFlight); the caller reads it unless the caller took the turn.
	taken atomic.Bool
}

// combinedReply is a caller's part of the reply.
type combinedReply struct {
	s       *session
	deleted []string // every caller's completed names (each looks up its own)
	claimed []db.LeaseClaimRow
	err     error
}

// combineMax is how many leases the calls sent together claim at most:
// past it, a commit per round trip is a small part of the statement's
// cost, and the calls gain more from running beside each other.
const combineMax = 100

// combiner queues the calls of each group. mu is a leaf lock.
type combiner struct {
	mu      sync.Mutex
	pending map[string][]*combined // by group
	sending map[string]int         // senders running, by group
}

// completeAndClaimCombined queues call for group and starts a sender if
// none runs for it, or if the calls queued claim combineMax leases. A
// caller whose ctx can never end (Done is nil) cannot give up, so when it
// would start a sender it sends a round trip on its own goroutine
// instead, sparing the hand-off, as inFlight does; the calls that came
// meanwhile go on a sender. Once the client is closed, the calls queued
// get pgbaton.ErrClosed.
func (c *Client) completeAndClaimCombined(ctx context.Context, group string, call *combined) {
	cc := &c.cc
	cc.mu.Lock()
	if cc.pending == nil {
		cc.pending, cc.sending = map[string][]*combined{}, map[string]int{}
	}
	cc.pending[group] = append(cc.pending[group], call)
	queued := 0
	for _, q := range cc.pending[group] {
		queued += q.n
	}
	start := cc.sending[group] == 0 || queued >= combineMax
	if start {
		cc.sending[group]++
	}
	cc.mu.Unlock()
	if start && ctx.Done() == nil && c.k.enter() {
		// call is among those taken, waits for the next, or went with
		// another sender's; none taken ends this turn (takeCombined).
		if calls := c.takeCombined(group); calls != nil {
			c.sendCalls(group, calls)
			start = c.moreCombined(group)
		} else {
			start = false
		}
		c.background.Done()
	}
	if !start || c.k.spawn(func() { c.sendCombined(group) }) {
		return
	}
	// Closed: nothing will send what is queued for group.
	for calls := c.takeCombined(group); calls != nil; calls = c.takeCombined(group) {
		for _, call := range calls {
			c.deliver(call, combinedReply{err: pgbaton.ErrClosed})
		}
	}
}

// takeCombined takes the calls queued for group, the first and then as
// many as claim combineMax leases in all, or, when none is left, ends the
// caller's turn as a sender of group (see idleLocked) and returns nil.
func (c *Client) takeCombined(group string) []*combined {
	cc := &c.cc
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.idleLocked(group) {
		return nil
	}
	q := cc.pending[group]
	k, sum := 0, 0
	for k < len(q) && (k == 0 || sum+q[k].n <= combineMax) {
		sum += q[k].n
		k++
	}
	take := q[:k:k]
	if k == len(q) {
		cc.pending[group] = nil
	} else {
		cc.pending[group] = q[k:]
	}
	return take
}

// moreCombined reports whether calls are queued for group, and ends the
// caller's turn as a sender when none is.
func (c *Client) moreCombined(group string) bool {
	c.cc.mu.Lock()
	defer c.cc.mu.Unlock()
	return !c.cc.idleLocked(group)
}

// idleLocked ends a sender's turn, and reports true, when no call is
// queued for group; the group is forgotten with its last sender. cc.mu is
// held.
func (cc *combiner) idleLocked(group string) bool {
	if len(cc.pending[group]) > 0 {
		return false
	}
	if cc.sending[group]--; cc.sending[group] == 0 {
		delete(cc.pending, group)
		delete(cc.sending, group)
	}
	return true
}

// sendCombined sends the queued calls of group, a round trip at a time,
// until none is left.
func (c *Client) sendCombined(group string) {
	for {
		calls := c.takeCombined(group)
		if calls == nil {
			return
		}
		c.sendCalls(group, calls)
	}
}

// sendCalls sends calls in one round trip and hands each its share.
func (c *Client) sendCalls(group string, calls []*combined) {
	// Bounded by the TTL, as inFlight's statements: a later reply is of no
	// use. Not cancelled by Close, which waits for it.
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.TTL)
	defer cancel()
	s, err := c.sessionFor(ctx)
	if err != nil {
		for _, call := range calls {
			c.deliver(call, combinedReply{err: err})
		}
		return
	}
	p := db.LeaseCompleteManyParams{Owner: c.cfg.Owner}
	n := 0
	for _, call := range calls {
		names, tokens := grants(call.cb.leases)
		p.Names, p.Tokens = append(p.Names, names...), append(p.Tokens, tokens...)
		n += call.n
	}
	ref := newRef()
	var r completeAndClaimReply
	err = c.retry(ctx, false, func(ctx context.Context) (err error) {
		r, err = c.completeAndClaim(ctx, p, group, n, s, ref)
		return err
	})
	if err != nil {
		if f, _ := classify(context.Background(), err); f == ambiguous || ctx.Err() != nil {
			// The claim may have landed (a broken connection, the TTL's
			// timeout): give back by its request id whatever it granted.
			c.k.giveBackRef(s, ref)
		}
		err = c.dbError("complete and claim from "+group, err)
		for _, call := range calls {
			c.deliver(call, combinedReply{err: err})
		}
		return
	}
	rows := r.claimed
	for _, call := range calls {
		share := rows[:min(call.n, len(rows)):min(call.n, len(rows))]
		rows = rows[len(share):]
		c.deliver(call, combinedReply{s: s, deleted: r.deleted, claimed: share})
	}
}

// deliver hands r to call's caller or, if it gave up, settles r: its
// finished leases from the reply, its share of the claim given back.
func (c *Client) deliver(call *combined, r combinedReply) {
	call.done <- r
	if call.taken.CompareAndSwap(false, true) {
		return
	}
	<-call.done // the caller gave up
	_ = call.cb.finish(r.deleted, r.err)
	if len(r.claimed) > 0 {
		names := make([]string, len(r.claimed))
		tokens := make([]int64, len(r.claimed))
		for i, row := range r.claimed {
			names[i], tokens[i] = row.Name, row.Token
		}
		// In the background: the sender goes on with the next round trip.
		c.goBackground(func(ctx context.Context) {
			ctx, cancel := context.WithTimeout(ctx, c.cfg.ReleaseTimeout)
			defer cancel()
			c.releaseGrants(ctx, names, tokens)
		})
	}
}

// awaitCombined waits for call's reply or ctx's end, whichever is first;
// ok is false when the caller gives up (the sender then settles the
// reply).
func awaitCombined(ctx context.Context, call *combined) (r combinedReply, ok bool) {
	select {
	case r = <-call.done:
		return r, true
	case <-ctx.Done():
	}
	if call.taken.CompareAndSwap(false, true) {
		return r, false
	}
	return <-call.done, true
}
