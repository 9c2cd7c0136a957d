package leasetable

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pgbaton/pgbaton/internal/db"
)

// releaseAll gives back stopped leases and, in the same round trip, the
// retried ones whose earlier release or completion could not reach the
// database. It records the outcome of the stopped leases only: a retried
// lease's caller was already told its result, and a repeated Complete must
// keep returning it (the item was released, not completed). It returns an
// error naming the leases it could not reach the database for. Leases
// taken over meanwhile are not an error: nothing of theirs was ours to
// give back.
func (c *Client) releaseAll(ctx context.Context, stopped, retried []*Lease) error {
	leases := append(slices.Clip(stopped), retried...)
	if len(leases) == 0 {
		return nil
	}
	names, tokens := grants(leases)
	ctx, cancel := c.cleanupContext(ctx)
	defer cancel()
	freed, err := c.releaseMany(ctx, names, tokens)
	if err != nil {
		err = c.dbError("release", err)
		for _, l := range stopped {
			l.setReleaseErr(err)
			l.recordReleased(false)
		}
		return fmt.Errorf("leasetable: %d lease(s) not given back, held until their TTL: %s: %w",
			len(leases), quoteNames(names, 10), err)
	}
	gone := make(map[string]bool, len(freed))
	for _, n := range freed {
		gone[n] = true
	}
	for _, l := range stopped {
		if !gone[l.name] {
			l.setReleaseErr(fmt.Errorf("%w: %q token %d was taken over before release", ErrNotHeld, l.name, l.token))
		} else {
			l.setReleaseErr(nil)
		}
		l.recordReleased(!gone[l.name])
	}
	return nil
}

// releaseMany gives back the grants (names[i], tokens[i]) in one round
// trip, once more on a fresh connection if need be, and returns the names
// it freed (not those taken over meanwhile).
func (c *Client) releaseMany(ctx context.Context, names []string, tokens []int64) (freed []string, err error) {
	var rows []db.LeaseReleaseManyRow
	err = c.retry(ctx, true, func(ctx context.Context) (err error) {
		rows, err = c.q.LeaseReleaseMany(ctx, c.pool, db.LeaseReleaseManyParams{Names: names, Tokens: tokens, Owner: c.cfg.Owner})
		return err
	})
	var wake []string
	for _, r := range rows {
		freed = append(freed, r.Name)
		if r.Waiters {
			wake = append(wake, r.Name)
		}
	}
	c.notifyWaiters(ctx, wake)
	return freed, err
}

// notifyWaiters wakes the waiters of the leases named (and of their
// groups) once their release has committed. The release reports whether
// anyone waits; the NOTIFY goes in a statement of its own because a
// NOTIFY in the release's transaction would hold the server's
// database-wide notify lock through that commit's flush (see
// pgbaton.notify_waiters). Best effort: a waiter not woken looks again at
// the expiry it knows.
func (c *Client) notifyWaiters(ctx context.Context, names []string) {
	if len(names) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ReleaseTimeout)
	defer cancel()
	if err := c.q.LeaseNotifyWaiters(ctx, c.pool, names); err != nil {
		c.log.Debug("pgbaton: waking waiters failed; they look again at the expiry they know", "leases", names, "error", err)
	}
}

// grants are the names and tokens of leases, as the batch protocol
// functions take them.
func grants(leases []*Lease) (names []string, tokens []int64) {
	names, tokens = make([]string, len(leases)), make([]int64, len(leases))
	for i, l := range leases {
		names[i], tokens[i] = l.name, l.token
	}
	return names, tokens
}

// quoteNames lists names quoted, at most max of them and how many more.
func quoteNames(names []string, max int) string {
	quoted := make([]string, 0, min(len(names), max)+1)
	for _, n := range names[:min(len(names), max)] {
		quoted = append(quoted, strconv.Quote(n))
	}
	if len(names) > max {
		quoted = append(quoted, fmt.Sprintf("and %d more", len(names)-max))
	}
	return strings.Join(quoted, ", ")
}
