package leasetable

import (
	"context"
	"fmt"
	"time"

	"github.com/pgbaton/pgbaton/internal/db"
)

// handOff moves l from the held leases to those being completed in a
// caller's transaction: Close no longer releases it.
func (c *Client) handOff(l *Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.leases, l)
	c.handedOff[l] = struct{}{}
}

// settleLater has a settle loop learn how the transaction of handed-off
// leases ends. Call it only once their complete_tx was sent: before, an
// unlocked row would look like a rolled-back completion.
func (c *Client) settleLater(leases []*Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range leases {
		if _, ok := c.handedOff[l]; ok {
			c.toSettle[l] = struct{}{}
		}
	}
	if c.settling || c.closed || len(c.toSettle) == 0 {
		return
	}
	c.settling = true
	c.background.Add(1)
	go func() {
		defer c.background.Done()
		c.settleLoop(c.bg)
	}()
}

// settleLoop learns how the transactions of CompleteTx ended, in one
// statement for all of them per round: a committed completion's lease
// ends; a rolled-back one's row is released at once, so its item is
// claimable again without waiting for the lifeline to end. Transactions
// still open are asked again, less and less often, up to once per
// RenewInterval. It returns when none is left or the client closes.
func (c *Client) settleLoop(ctx context.Context) {
	delay := 10 * time.Millisecond
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		pending := make([]*Lease, 0, len(c.toSettle))
		for l := range c.toSettle {
			pending = append(pending, l)
		}
		if len(pending) == 0 {
			c.settling = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		if c.settle(ctx, pending) {
			delay = 10 * time.Millisecond
		} else {
			delay = min(2*delay, c.cfg.RenewInterval)
		}
		t.Reset(delay)
	}
}

// settle asks once how pending's transactions ended and ends the leases
// whose transaction did; it reports whether any did.
func (c *Client) settle(ctx context.Context, pending []*Lease) bool {
	names, tokens := grants(pending)
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ReleaseTimeout)
	defer cancel()
	rows, err := c.q.LeaseSettleMany(ctx, c.pool, db.LeaseSettleManyParams{Names: names, Tokens: tokens, Owner: c.cfg.Owner})
	if err != nil {
		c.log.Debug("pgbaton: asking how completions in transactions ended failed; asking again", "error", err)
		return false
	}
	state := make(map[string]string, len(rows))
	for _, r := range rows {
		state[r.Name] = r.State
	}
	settled := false
	var released []string
	for _, l := range pending {
		switch state[l.name] {
		case "gone":
			l.endHandedOff("committed")
			settled = true
		case "released":
			// Said before Done closes: a Complete after it must not
			// report the item completed.
			l.setReleaseErr(fmt.Errorf("%w: %q token %d: its completion in a transaction rolled back; the item was released, not completed", ErrNotHeld, l.name, l.token))
			l.endHandedOff("rolled back; the item was released")
			released = append(released, l.name)
			settled = true
		}
	}
	c.notifyWaiters(ctx, released)
	return settled
}

// endHandedOff ends a lease completed in a transaction, as released.
func (l *Lease) endHandedOff(how string) {
	l.transition(leaseReleased, fmt.Errorf("%w: %q token %d: completed in a transaction (%s)", ErrReleased, l.name, l.token, how), "")
}
