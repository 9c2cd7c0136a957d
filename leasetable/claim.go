package leasetable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// maxClaim bounds the n of one claim.
const maxClaim = 1 << 20

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
	if err := c.checkClaim(group, n); err != nil {
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

// checkClaim checks the arguments of a claim and that c is open.
func (c *Client) checkClaim(group string, n int) error {
	if err := checkName("group", group); err != nil {
		return err
	}
	if n <= 0 || n > maxClaim {
		return invalid("claim count must be in 1..%d, got %d", maxClaim, n)
	}
	return c.checkOpen()
}

// claim claims up to n leases of group; each grant is recorded as an
// acquired attempt that began at waitStart.
func (c *Client) claim(ctx context.Context, group string, n int, waitStart time.Time) ([]*Lease, error) {
	start := time.Now()
	rows, err := c.q.LeaseClaim(ctx, c.pool, db.LeaseClaimParams{LeaseGroup: group, Owner: c.cfg.Owner, N: int32(n), TtlMs: c.ttlMs})
	if err != nil {
		return nil, c.dbError("claim from "+group, err)
	}
	return c.trackClaimed(ctx, group, rows, start, waitStart)
}

// trackClaimed turns claimed rows into kept leases. If the client closed
// meanwhile, every one of them is given back.
func (c *Client) trackClaimed(ctx context.Context, group string, rows []db.LeaseClaimRow, start, waitStart time.Time) ([]*Lease, error) {
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
	cb, err := c.startCompletion(leases)
	if err != nil || len(cb.leases) == 0 {
		return err
	}
	deleted, err := c.q.LeaseCompleteMany(ctx, c.pool, cb.params(c))
	if err != nil {
		err = c.dbError("complete", err)
	}
	return cb.finish(deleted, err)
}

// CompleteAndClaim completes done (as Complete) and claims up to n leases
// of group (as Claim) in one round trip and one transaction: a worker's
// loop pays one commit per batch instead of two. If the round trip fails,
// neither happened: done stay uncompleted, their rows expire at their TTL
// and are claimed again, as after a failed Complete. If some of done were
// taken over meanwhile, the error wraps ErrNotHeld and the claimed leases
// are returned all the same: they are held and must be completed or
// released.
func (c *Client) CompleteAndClaim(ctx context.Context, group string, n int, done ...*Lease) ([]*Lease, error) {
	if err := c.checkClaim(group, n); err != nil {
		return nil, err
	}
	cb, err := c.startCompletion(done)
	if err != nil {
		return nil, err
	}
	if len(cb.leases) == 0 {
		return c.Claim(ctx, group, n)
	}
	start := time.Now()
	var deleted []string
	var claimed []db.LeaseClaimRow
	b := &pgx.Batch{}
	p := cb.params(c)
	b.Queue(db.LeaseCompleteManySQL, p.Names, p.Tokens, p.Owner).Query(func(rows pgx.Rows) error {
		var err error
		deleted, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	b.Queue(db.LeaseClaimSQL, group, c.cfg.Owner, int32(n), c.ttlMs).Query(func(rows pgx.Rows) error {
		var err error
		claimed, err = pgx.CollectRows(rows, pgx.RowToStructByPos[db.LeaseClaimRow])
		return err
	})
	// One implicit transaction up to the batch's Sync: a failed claim
	// undoes the completions.
	err = c.pool.SendBatch(ctx, b).Close()
	if err != nil {
		err = c.dbError("complete and claim from "+group, err)
		c.attemptFailed(ctx, group, err, start)
		return nil, cb.finish(nil, err)
	}
	doneErr := cb.finish(deleted, nil)
	leases, err := c.trackClaimed(ctx, group, claimed, start, start)
	if err != nil {
		return nil, errors.Join(doneErr, err)
	}
	if len(leases) == 0 {
		c.attempted(ctx, group, telemetry.Held, start)
	}
	return leases, doneErr
}

// completion is a Complete in progress: leases stopped and not yet
// answered by the database.
type completion struct {
	leases []*Lease
}

// startCompletion checks leases and stops those not released or completed
// yet; the caller deletes their rows and calls finish.
func (c *Client) startCompletion(leases []*Lease) (*completion, error) {
	for _, l := range leases {
		if l == nil || l.c != c {
			return nil, invalid("Complete needs leases of this client")
		}
	}
	cb := &completion{leases: make([]*Lease, 0, len(leases))}
	for _, l := range leases {
		l.releaseOnce.Do(func() {
			l.stop()
			cb.leases = append(cb.leases, l)
		})
	}
	return cb, nil
}

// params are the arguments of pgbaton.complete_many for cb's leases.
func (cb *completion) params(c *Client) db.LeaseCompleteManyParams {
	p := db.LeaseCompleteManyParams{
		Names:  make([]string, len(cb.leases)),
		Tokens: make([]int64, len(cb.leases)),
		Owner:  c.cfg.Owner,
	}
	for i, l := range cb.leases {
		p.Names[i], p.Tokens[i] = l.name, l.token
	}
	return p
}

// finish records the outcome: deleted are the names whose rows went, err
// (already mapped) that the round trip failed.
func (cb *completion) finish(deleted []string, err error) error {
	if err != nil {
		for _, l := range cb.leases {
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
	for _, l := range cb.leases {
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
