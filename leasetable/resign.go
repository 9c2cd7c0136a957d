package leasetable

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton/internal/db"
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
	asked, ask := context.WithCancelCause(l.Context())
	ld := &Leadership{lease: l, asked: asked, askedDone: make(chan struct{})}
	c.k.Spawn(func() { ld.watchResign(ask) }) // false: the client closed, and the lease ends with it
	return ld
}

// watchResign waits for a request that this term resign, as an observer
// of its own election (woken by request_resign's notification, or at its
// poll when the client holds no listen slot; every TTL regardless, in case
// a notification was lost with a LISTEN connection), until leadership
// ends or the client closes. The request's first look comes after the
// registration, so a request made before it is seen too.
func (ld *Leadership) watchResign(ask context.CancelCauseFunc) {
	l := ld.lease
	c, ctx := l.c, l.Context()
	var w *listener.Waiter
	defer func() {
		if w != nil {
			c.stopWaiting(w)
		}
	}()
	for ctx.Err() == nil {
		var err error
		if w == nil {
			if w, err = c.joinQueue(ctx, l.name, false, false, pgtype.Int4{}); err != nil {
				c.log.Debug("pgbaton: leader cannot watch for requests to resign; trying again", "election", l.name, "error", err)
				if c.ln.Wait(ctx, nil, nil, c.cfg.RenewInterval) != nil {
					return
				}
				continue
			}
		}
		rows, err := c.q.LeaseResignRequest(ctx, c.pool, db.LeaseResignRequestParams{Name: l.name, Token: l.token})
		if err == nil && len(rows) > 0 {
			ask(fmt.Errorf("%w: leader of %q (term %d) asked by %s: %s", ErrResignRequested, l.name, l.token, rows[0].RequestedBy, rows[0].Reason))
			close(ld.askedDone)
			return
		}
		if err != nil && ctx.Err() == nil {
			c.log.Debug("pgbaton: reading requests to resign failed", "election", l.name, "error", err)
		}
		if w.Wait(ctx, c.cfg.TTL, nil) != nil {
			return
		}
	}
}
