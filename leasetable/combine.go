package leasetable

import (
	"context"
	"sync"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// Concurrent CompleteAndClaim calls of one client on one group are sent
// together: one round trip and one transaction complete every caller's
// finished leases and claim the sum of their counts, and each caller gets
// its own share of the claimed leases. One such round trip per group is in
// flight at a time; calls that arrive meanwhile go in the next. A call
// that finds none in flight is sent at once, so a lone worker waits for
// nothing. This is what River's completer does for its workers: at batch
// 1, a commit per item made 4 workers slower than River on a server whose
// commits are slow (TestConcurrentCompleteAndClaimShareARoundTrip).
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

	mu   sync.Mutex // guards gone; a leaf lock
	gone bool       // the caller gave up: the sender settles the reply
}

// combinedReply is a caller's part of the reply.
type combinedReply struct {
	s       *lifeline
	deleted []string // every caller's completed names (each looks up its own)
	claimed []db.LeaseClaimRow
	err     error
}

// combiner queues the calls of each group. mu is a leaf lock.
type combiner struct {
	mu      sync.Mutex
	pending map[string][]*combined // by group
	sending map[string]bool        // groups with a round trip in flight
}

// completeAndClaimCombined queues call for group and starts a sender if
// none runs for it. A caller whose ctx can never end (Done is nil) cannot
// give up, so when it finds no sender it sends its own round trip on its
// goroutine, sparing the hand-off, as inFlight does; the calls that came
// meanwhile go on a sender. Once the client is closed, the calls queued
// get pgbaton.ErrClosed.
func (c *Client) completeAndClaimCombined(ctx context.Context, group string, call *combined) {
	cc := &c.cc
	cc.mu.Lock()
	if cc.pending == nil {
		cc.pending, cc.sending = map[string][]*combined{}, map[string]bool{}
	}
	cc.pending[group] = append(cc.pending[group], call)
	start := !cc.sending[group]
	cc.sending[group] = true
	cc.mu.Unlock()
	if start && ctx.Done() == nil && c.enter() {
		c.sendCalls(group, c.takeCombined(group)) // call is first in line
		c.background.Done()
		start = c.moreCombined(group)
	}
	if !start || c.spawn(func() { c.sendCombined(group) }) {
		return
	}
	// Closed: nothing will send what is queued for group.
	for calls := c.takeCombined(group); calls != nil; calls = c.takeCombined(group) {
		for _, call := range calls {
			c.deliver(call, combinedReply{err: pgbaton.ErrClosed})
		}
	}
}

// takeCombined takes the calls queued for group, as many as one claim may
// count, and marks the group idle when none is left.
func (c *Client) takeCombined(group string) []*combined {
	cc := &c.cc
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.idleLocked(group) {
		return nil
	}
	q := cc.pending[group]
	k, sum := 0, 0
	for k < len(q) && sum+q[k].n <= maxClaim {
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

// moreCombined reports whether calls are queued for group, and marks the
// group idle when none is.
func (c *Client) moreCombined(group string) bool {
	c.cc.mu.Lock()
	defer c.cc.mu.Unlock()
	return !c.cc.idleLocked(group)
}

// idleLocked marks group idle, and reports true, when no call is queued
// for it. cc.mu is held.
func (cc *combiner) idleLocked(group string) bool {
	if len(cc.pending[group]) > 0 {
		return false
	}
	delete(cc.pending, group)
	delete(cc.sending, group)
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
	s, err := c.lifelineFor(ctx)
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
			c.goBackground(func(ctx context.Context) { c.releaseRef(ctx, s, ref) })
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
	call.mu.Lock()
	if !call.gone {
		call.done <- r
		call.mu.Unlock()
		return
	}
	call.mu.Unlock()
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
	call.mu.Lock()
	defer call.mu.Unlock()
	select {
	case r = <-call.done:
		return r, true
	default:
		call.gone = true
		return r, false
	}
}
