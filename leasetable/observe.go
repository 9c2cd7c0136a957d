package leasetable

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/election"
	"github.com/pgbaton/pgbaton/internal/listener"
)

// Observe streams the leaders of election name as they change, to any
// process, candidate or not: the current leader first (when there is
// one), then each new leader as its term begins, in term order (terms
// only grow, so no leader is ever sent after a newer one), until ctx ends
// or the client closes, when the channel is closed.
//
// It is woken by the database when a term begins (pgbaton_lease
// notifications to its registration as an observer of the election; a
// client without a listen slot polls instead, as waiters do), and reads
// the leader then. The channel is unbuffered: an observer that reads
// slowly is sent the leader of the moment, and terms that began and ended
// while it was not reading are skipped, as they would be by a loop over
// Leader. Moments without a leader are not sent.
func (c *Client) Observe(ctx context.Context, name string) (<-chan Leader, error) {
	if err := checkName("election name", name); err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, invalid("Observe needs a context")
	}
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	// Registered before the first look: a term that begins after the look
	// wakes it.
	w, err := c.joinQueue(ctx, name, false, false, pgtype.Int4{})
	if err != nil {
		return nil, err
	}
	ch := make(chan Leader)
	if !c.k.Spawn(func() { c.observe(ctx, w, ch) }) {
		c.stopWaiting(w)
		return nil, pgbaton.ErrClosed
	}
	return ch, nil
}

// observe is Observe's goroutine: it follows the leaders
// (election.Follow) until ctx ends or the client closes.
func (c *Client) observe(ctx context.Context, w *listener.Waiter, ch chan<- Leader) {
	defer close(ch)
	defer c.stopWaiting(w)
	election.Follow(ctx, w, ch, election.Follower[Leader]{
		Read: func(ctx context.Context) (Leader, int64, time.Duration, bool, error) {
			ld, err := c.Leader(ctx, w.Name)
			if errors.Is(err, ErrNoLeader) {
				return ld, 0, 0, false, nil
			}
			return ld, ld.Term, ld.Remaining, err == nil, err
		},
		TTL: c.cfg.TTL, Closed: c.bg.Done(), Logger: c.log.With("election", w.Name),
	})
}
