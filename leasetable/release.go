package leasetable

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pgbaton/pgbaton/internal/completion"
	"github.com/pgbaton/pgbaton/internal/db"
)

// releaseAll gives back stopped leases and, in the same round trip, the
// retried ones whose earlier give-back failed. It records the outcome of
// the stopped leases only (a retried lease's caller was told its result).
// Its error names the leases it could not give back; leases taken over
// meanwhile are not an error.
func (c *Client) releaseAll(ctx context.Context, stopped, retried []*Lease) error {
	leases := append(slices.Clip(stopped), retried...)
	if len(leases) == 0 {
		return nil
	}
	names, tokens := grants(byName(leases))
	ctx, cancel := c.cleanupContext(ctx)
	defer cancel()
	freed, err := c.releaseMany(ctx, names, tokens, lostNames(leases))
	if err != nil {
		err = c.dbError("release", err)
		for _, l := range stopped {
			l.st.SetReleaseErr(err)
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
			l.st.SetReleaseErr(fmt.Errorf("%w: %q token %d was taken over before release", ErrNotHeld, l.name, l.token))
		} else {
			l.st.SetReleaseErr(nil)
		}
		l.recordReleased(!gone[l.name])
	}
	return nil
}

// releaseMany gives back the grants (names[i], tokens[i]) in one round
// trip and returns the names it freed; those named in lost were lost, and
// keep their lock-delay.
func (c *Client) releaseMany(ctx context.Context, names []string, tokens []int64, lost []string) (freed []string, err error) {
	var rows []db.LeaseReleaseManyRow
	err = c.retry(ctx, true, func(ctx context.Context) (err error) {
		rows, err = c.q.LeaseReleaseMany(ctx, c.pool, db.LeaseReleaseManyParams{Names: names, Tokens: tokens, Owner: c.cfg.Owner, Lost: lost})
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
// groups), in a statement after the release's commit: a NOTIFY in it would
// hold the database-wide notify lock through the commit's flush. Best
// effort: a waiter not woken looks again at the expiry it knows.
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
	return completion.Grants(make([]string, 0, len(leases)), make([]int64, 0, len(leases)), leases)
}

// byName sorts leases by name, so that two statements giving back some of
// the same rows (Close and the keeper's give-back) lock them in one order
// instead of deadlocking.
func byName(leases []*Lease) []*Lease {
	slices.SortFunc(leases, func(a, b *Lease) int { return strings.Compare(a.name, b.name) })
	return leases
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
