package leasetable

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/election"
	"github.com/pgbaton/pgbaton/internal/listener"
)

// RequestResign asks the leader of election name to step down, for
// reason, and returns the term it asked; ErrNoLeader when nobody leads.
// The leader sees it (Leadership.ResignRequested; Campaign ends the term's
// context), finishes its term and resigns, and the first candidate in the
// queue takes over at once. The first request of a term stands. Calls
// from code are not audited; an operator's `pgbaton resign` is.
func (c *Client) RequestResign(ctx context.Context, name, reason string) (int64, error) {
	if err := checkName("election name", name); err != nil {
		return 0, err
	}
	if ctx == nil || reason == "" {
		return 0, invalid("RequestResign needs a context and a reason")
	}
	if err := c.checkOpen(); err != nil {
		return 0, err
	}
	term, err := c.q.LeaseRequestResign(ctx, c.pool, db.LeaseRequestResignParams{Name: name, Reason: reason, RequestedBy: c.cfg.Owner})
	if err != nil {
		return 0, c.dbError("request that the leader of "+name+" resign", err)
	}
	if term == 0 {
		return 0, fmt.Errorf("%w of %q to ask", ErrNoLeader, name)
	}
	return term, nil
}

// newLeadership is the leadership of election lease l, watching for
// requests to resign until it ends.
func (c *Client) newLeadership(l *Lease) *Leadership {
	ld := &Leadership{lease: l, asked: election.NewAsked(l.Context())}
	c.k.Spawn(func() { c.watchResign(l, ld.asked) }) // false: the client closed, and the lease ends with it
	return ld
}

// watchResign waits for a request that the term of l resign
// (election.Watch), until leadership ends or the client closes.
func (c *Client) watchResign(l *Lease, asked *election.Asked) {
	election.Watch(l.Context(), asked, election.ResignWatch[*listener.Waiter]{
		Join: func(ctx context.Context) (*listener.Waiter, error) {
			return c.joinQueue(ctx, l.name, false, false, pgtype.Int4{})
		},
		Leave: c.stopWaiting,
		Look: func(ctx context.Context) (error, error) {
			rows, err := c.q.LeaseResignRequest(ctx, c.pool, db.LeaseResignRequestParams{Name: l.name, Token: l.token})
			if err != nil || len(rows) == 0 {
				return nil, err
			}
			return fmt.Errorf("%w: leader of %q (term %d) asked by %s: %s", ErrResignRequested, l.name, l.token, rows[0].RequestedBy, rows[0].Reason), nil
		},
		Pause:  func(ctx context.Context) error { return c.ln.Wait(ctx, nil, nil, c.cfg.RenewInterval) },
		TTL:    c.cfg.TTL,
		Logger: c.log.With("election", l.name),
	})
}
