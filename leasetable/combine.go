package leasetable

import (
	"context"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/combine"
	"github.com/pgbaton/pgbaton/internal/completion"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/inflight"
	"github.com/pgbaton/pgbaton/internal/pgerr"
	"github.com/pgbaton/pgbaton/internal/session"
)

// Concurrent CompleteAndClaim calls of one client on one group are sent
// together, a few round trips of a group in flight at once: the queue
// that decides which calls go together, and why, and the senders' loop
// are internal/combine's; the round trip is this file's (sendCalls).
//
// Each call goes through inFlight like any statement that may grant
// leases: a caller whose context ends returns at once, and when the reply
// comes its finished leases are settled from it and its share of the
// claim is given back (settleAbandoned). The queues are the keeper's.

// combined is one CompleteAndClaim call waiting for its round trip.
type combined struct {
	cb   *completion.Batch[*Lease]
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

// combiner is the client's combine.Sender: the queues are the keeper's.
func combiner(c *Client) combine.Sender[*keeper, *combined] {
	return combine.Sender[*keeper, *combined]{Ask: c.k.Ask, Post: c.k.Post, Spawn: c.k.Spawn, Queue: keeperCalls, Send: c.sendCalls}
}

func keeperCalls(k *keeper) *combine.Queue[*combined] { return &k.cc }

// completeAndClaimCombined queues call for group and returns its part of
// the reply: sent by this caller or another (combine.Sender.Join). Calls
// still queued when the client closes get pgbaton.ErrClosed from Close.
func (c *Client) completeAndClaimCombined(group string, call *combined) combinedReply {
	if !c.cc.Join(group, call, call.n) {
		return combinedReply{err: pgbaton.ErrClosed}
	}
	return <-call.done
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
		p.Names, p.Tokens = completion.Grants(p.Names, p.Tokens, call.cb.Sent)
		n += call.n
	}
	claim := db.LeaseClaimParams{LeaseGroup: group, Owner: c.cfg.Owner, N: int32(n), TtlMs: c.ttlMs, Session: s.Param(), Ref: inflight.NewRef()}
	var deleted []string
	var claimed []db.LeaseClaimRow
	err = c.retry(ctx, false, func(ctx context.Context) (err error) {
		deleted, claimed, err = c.q.LeaseCompleteAndClaim(ctx, c.pool, p, claim)
		return err
	})
	if err = pgerr.Bounded(ctx, c.cfg.TTL, err); err != nil {
		if f, _ := pgerr.Classify(context.Background(), err); f == pgerr.Ambiguous || ctx.Err() != nil {
			// The claim may have landed (a broken connection, the TTL's
			// timeout): give back by its request id whatever it granted.
			c.k.giveBackRef(s, claim.Ref)
		}
		err = c.dbError("complete and claim from "+group, err)
		for _, call := range calls {
			call.done <- combinedReply{err: err}
		}
		return
	}
	rows := claimed
	for _, call := range calls {
		var share []db.LeaseClaimRow
		share, rows = combine.Share(rows, call.n)
		if len(share) > 0 {
			// A use of s for the reader of the reply, until it keeps its
			// share (CompleteAndClaim) or gives it back (settleAbandoned).
			c.k.using.Add(1)
		}
		call.done <- combinedReply{s: s, deleted: deleted, claimed: share}
	}
}

// settleAbandoned settles the reply of a call whose caller gave up: its
// finished leases from the reply, its share of the claim given back.
func (c *Client) settleAbandoned(ctx context.Context, call *combined, r combinedReply) {
	_ = finish(call.cb, r.deleted, r.err)
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
