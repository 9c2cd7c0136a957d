package leasetable

import (
	"context"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/session"
)

// Concurrent CompleteAndClaim calls of one client on one group are sent
// together: one round trip and one transaction complete every caller's
// finished leases and claim the sum of their counts, and each caller gets
// its own share of the claimed leases. Up to combineSenders round trips of
// a group are in flight at once; the calls that arrive meanwhile wait to
// go together in the next, up to combineMax leases claimed in all; once
// that many wait, another round trip goes at once, beside the others. A
// call that finds a sender free is sent at once, so a lone worker waits
// for nothing. This is what River's completer does for its workers: at
// batch 1, a commit per item made 4 workers slower than River on a server
// whose commits are slow (TestConcurrentCompleteAndClaimShareARoundTrip).
// Large calls are not held back: with one round trip at a time, 4 workers
// claiming 100 each ran their statements one after another on one server
// core, where raw pgx runs four at once
// (TestLargeCompleteAndClaimCallsOverlap).
//
// Each call goes through inFlight like any statement that may grant
// leases: a caller whose context ends returns at once, and when the reply
// comes its finished leases are settled from it and its share of the
// claim is given back (settleAbandoned). The queues are the keeper's.

// combined is one CompleteAndClaim call waiting for its round trip.
type combined struct {
	cb   *completion
	n    int
	done chan combinedReply // buffered: the sender never blocks on it
}

// combinedReply is a caller's part of the reply.
type combinedReply struct {
	s       *session.Session
	deleted []string // every caller's completed names (each looks up its own)
	claimed []db.LeaseClaimRow
	err     error
}

// combineMax is how many leases the calls sent together claim at most:
// past it, a commit per round trip is a small part of the statement's
// cost, and the calls gain more from running beside each other.
const combineMax = 100

// combineSenders is how many round trips of a group are in flight at
// once (unless combineMax leases wait): one left a server core idle while
// it was on the wire. 4 workers on a 2-core AMD EPYC host, two interleaved
// rounds of 5 runs, pgbaton ÷ raw pgx with one and with two: batch 1,
// 0.96-0.97 and 1.36-1.44; batch 10, 0.87-1.02 and 0.99-1.14; batch 10
// with 1M items queued, 0.68-0.76 and 1.01-1.23
// (TestSmallCompleteAndClaimCallsOverlap).
const combineSenders = 2

// combiner is the calls queued per group, owned by the keeper.
type combiner struct {
	pending map[string][]*combined // by group
	sending map[string]int         // senders running, by group
}

// completeAndClaimCombined queues call for group and returns its part of
// the reply. When fewer than combineSenders senders run for group, or the
// calls queued claim combineMax leases, it sends a round trip itself (call
// is among those taken, waits for the next, or went with another
// sender's), then leaves what is queued to a sender of its own. Calls
// still queued when the client closes get pgbaton.ErrClosed from Close.
func (c *Client) completeAndClaimCombined(group string, call *combined) combinedReply {
	var start bool
	if !c.k.ask(func(k *keeper) { start = k.cc.queue(group, call) }) {
		return combinedReply{err: pgbaton.ErrClosed}
	}
	if start {
		if calls := c.takeCombined(group); calls != nil {
			c.sendCalls(group, calls)
			var more bool
			c.k.ask(func(k *keeper) { more = !k.cc.idle(group) })
			if more {
				c.k.spawn(func() { c.sendCombined(group) })
			}
		}
	}
	return <-call.done
}

// queue queues call for group and reports whether its caller starts a
// sender's turn.
func (cc *combiner) queue(group string, call *combined) bool {
	if cc.pending == nil {
		cc.pending, cc.sending = map[string][]*combined{}, map[string]int{}
	}
	cc.pending[group] = append(cc.pending[group], call)
	queued := 0
	for _, q := range cc.pending[group] {
		queued += q.n
	}
	start := cc.sending[group] < combineSenders || queued >= combineMax
	if start {
		cc.sending[group]++
	}
	return start
}

// takeCombined takes the calls queued for group, the first and then as
// many as claim combineMax leases in all, or, when none is left (or the
// client closed), ends the caller's turn as a sender of group and returns
// nil.
func (c *Client) takeCombined(group string) (take []*combined) {
	c.k.ask(func(k *keeper) {
		cc := &k.cc
		if cc.idle(group) {
			return
		}
		q := cc.pending[group]
		n, sum := 0, 0
		for n < len(q) && (n == 0 || sum+q[n].n <= combineMax) {
			sum += q[n].n
			n++
		}
		take, cc.pending[group] = q[:n:n], q[n:]
	})
	return take
}

// idle ends a sender's turn, and reports true, when no call is queued for
// group; the group is forgotten with its last sender.
func (cc *combiner) idle(group string) bool {
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
	for calls := c.takeCombined(group); calls != nil; calls = c.takeCombined(group) {
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
			call.done <- combinedReply{err: err}
		}
		return
	}
	defer c.k.unuse()
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
			call.done <- combinedReply{err: err}
		}
		return
	}
	rows := r.claimed
	for _, call := range calls {
		share := rows[:min(call.n, len(rows)):min(call.n, len(rows))]
		rows = rows[len(share):]
		if len(share) > 0 {
			// A use of s for the reader of the reply, until it keeps its
			// share (CompleteAndClaim) or gives it back (settleAbandoned).
			c.k.using.Add(1)
		}
		call.done <- combinedReply{s: s, deleted: r.deleted, claimed: share}
	}
}

// settleAbandoned settles the reply of a call whose caller gave up: its
// finished leases from the reply, its share of the claim given back.
func (c *Client) settleAbandoned(ctx context.Context, call *combined, r combinedReply) {
	_ = call.cb.finish(r.deleted, r.err)
	if len(r.claimed) == 0 {
		return
	}
	defer c.k.unuse() // counted by sendCalls
	names := make([]string, len(r.claimed))
	tokens := make([]int64, len(r.claimed))
	for i, row := range r.claimed {
		names[i], tokens[i] = row.Name, row.Token
	}
	// Best effort, logged: no Lease was made, so nothing tries again.
	if _, err := c.releaseMany(ctx, names, tokens, nil); err != nil {
		c.log.Warn("pgbaton: giving back a grant whose caller gave up failed", "leases", names, "error", err)
	}
}
