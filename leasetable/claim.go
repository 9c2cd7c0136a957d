package leasetable

import (
	"context"
	"fmt"
	"time"

	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// Register creates free lease rows for names in group: shards, work items
// or slots that Claim hands out. It returns how many rows were new; names
// already registered in group are left as they are. A name that exists
// outside group is an error (pgbaton.ErrInvalidArgument) and nothing is
// created.
func (c *Client) Register(ctx context.Context, group string, names ...string) (int, error) {
	if err := checkName("group", group); err != nil {
		return 0, err
	}
	if len(names) == 0 {
		return 0, invalid("Register needs at least one name")
	}
	for _, n := range names {
		if err := checkName("lease name", n); err != nil {
			return 0, err
		}
	}
	if err := c.checkOpen(); err != nil {
		return 0, err
	}
	n, err := c.q.LeaseRegister(ctx, c.pool, db.LeaseRegisterParams{LeaseGroup: group, Names: names})
	if err != nil {
		return 0, c.dbError("register in "+group, err)
	}
	return int(n), nil
}

// Claim takes up to n leases of group that are free: never held, released,
// or expired. Each gets its own new token and is kept alive like any
// lease. Concurrent claimers never wait on each other nor get the same
// lease (FOR UPDATE SKIP LOCKED). It returns fewer than n leases, maybe
// none, when no more are free; it does not wait.
func (c *Client) Claim(ctx context.Context, group string, n int) ([]*Lease, error) {
	if err := checkName("group", group); err != nil {
		return nil, err
	}
	if n <= 0 || n > 1<<20 {
		return nil, invalid("claim count must be in 1..%d, got %d", 1<<20, n)
	}
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	start := time.Now()
	leases, err := c.claim(ctx, group, n, start)
	switch {
	case err != nil:
		c.attemptFailed(ctx, group, err, start)
	case len(leases) == 0:
		c.attempted(ctx, group, telemetry.Held, start)
	}
	return leases, err
}

// claim claims up to n leases of group; each grant is recorded as an
// acquired attempt that began at waitStart.
func (c *Client) claim(ctx context.Context, group string, n int, waitStart time.Time) ([]*Lease, error) {
	start := time.Now()
	rows, err := c.q.LeaseClaim(ctx, c.pool, db.LeaseClaimParams{LeaseGroup: group, Owner: c.cfg.Owner, N: int32(n), TtlMs: c.ttlMs})
	if err != nil {
		return nil, c.dbError("claim from "+group, err)
	}
	leases := make([]*Lease, 0, len(rows))
	for _, r := range rows {
		l, err := c.track(r.Name, group, r.Token, r.ExpiresAt, start, waitStart)
		if err != nil {
			// Closed meanwhile: track gave this one back; give back the rest.
			for _, r := range rows[len(leases)+1:] {
				_, _ = c.q.LeaseRelease(ctx, c.pool, db.LeaseReleaseParams{Name: r.Name, Owner: c.cfg.Owner, Token: r.Token})
			}
			for _, l := range leases {
				_ = l.Release(ctx)
			}
			return nil, err
		}
		leases = append(leases, l)
	}
	return leases, nil
}

// Complete ends leases and deletes their rows in one round trip: the work
// items are done and will not be claimed again. Each is guarded by its
// token like Lease.Complete; those taken over meanwhile are left alone and
// reported in an error wrapping ErrNotHeld. Leases already released or
// completed are skipped.
func (c *Client) Complete(ctx context.Context, leases ...*Lease) error {
	for _, l := range leases {
		if l == nil || l.c != c {
			return invalid("Complete needs leases of this client")
		}
	}
	batch := make([]*Lease, 0, len(leases))
	names := make([]string, 0, len(leases))
	tokens := make([]int64, 0, len(leases))
	for _, l := range leases {
		l.releaseOnce.Do(func() {
			l.stop()
			batch = append(batch, l)
			names = append(names, l.name)
			tokens = append(tokens, l.token)
		})
	}
	if len(batch) == 0 {
		return nil
	}
	deleted, err := c.q.LeaseCompleteMany(ctx, c.pool, db.LeaseCompleteManyParams{Names: names, Tokens: tokens, Owner: c.cfg.Owner})
	if err != nil {
		err = c.dbError("complete", err)
		for _, l := range batch {
			l.setReleaseErr(err)
			l.recordReleased(false)
		}
		return err
	}
	gone := make(map[string]bool, len(deleted))
	for _, n := range deleted {
		gone[n] = true
	}
	var missing []string
	for _, l := range batch {
		l.recordReleased(!gone[l.name])
		if !gone[l.name] {
			missing = append(missing, l.name)
			l.setReleaseErr(fmt.Errorf("%w: %q token %d was taken over before completion", ErrNotHeld, l.name, l.token))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: taken over before completion: %v", ErrNotHeld, missing)
}
