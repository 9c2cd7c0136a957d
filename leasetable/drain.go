package leasetable

import "context"

// GroupCounts is what a work group holds at one instant (Client.Counts).
// Completing an item deletes it, so it is counted no more.
type GroupCounts struct {
	Free    int // registered and not held: never claimed, or released
	Held    int // claimed and held now
	Expired int // claimed, then lost by their holder: claimable again
}

// Total is the number of items the group holds, done with or not.
func (g GroupCounts) Total() int { return g.Free + g.Held + g.Expired }

// Drained is whether the group holds no item: every item registered in it
// was completed (or none ever was).
func (g GroupCounts) Drained() bool { return g.Total() == 0 }

// Counts reads how many items of group are free, held and expired, in one
// statement (pgbaton.group_counts in SQL). It reads every row of the
// group: for progress reports, dashboards and tests, not for each claim.
func (c *Client) Counts(ctx context.Context, group string) (GroupCounts, error) {
	if err := checkName("group", group); err != nil {
		return GroupCounts{}, err
	}
	if err := c.checkOpen(); err != nil {
		return GroupCounts{}, err
	}
	r, err := c.q.LeaseGroupCounts(ctx, c.pool, group)
	if err != nil {
		return GroupCounts{}, c.dbError("count items of "+group, err)
	}
	return GroupCounts{Free: int(r.Free), Held: int(r.Held), Expired: int(r.Expired)}, nil
}

// ClaimUntilDrained is ClaimWait for a batch that ends: it returns at
// least one and at most n leases of group while any item is left, waits
// while every item left is held (by this client or others: one released
// or lost comes back), and returns an error wrapping ErrDrained once the
// group holds no item at all, every one completed. A worker loop ends on
// ErrDrained:
//
//	for {
//		items, err := client.ClaimUntilDrained(ctx, "import", 10)
//		if errors.Is(err, leasetable.ErrDrained) {
//			return nil // every item is done
//		}
//		...
//	}
//
// Register the batch's items before the workers start: a group nothing
// was registered in yet is drained. The completion of the last item wakes
// the waiters at once, on the client's LISTEN connection (with NoListen,
// at their next look).
func (c *Client) ClaimUntilDrained(ctx context.Context, group string, n int) ([]*Lease, error) {
	return c.claimWaiting(ctx, group, n, true)
}
