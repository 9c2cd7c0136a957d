package leasetable_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// itemRow reports whether item's row is still there, and whether it is free.
func itemRow(t *testing.T, ctx context.Context, pool *pgxpool.Pool, item string) (exists, free bool) {
	t.Helper()
	err := pool.QueryRow(ctx, "SELECT owner IS NULL FROM pgbaton.lease WHERE name = $1", item).Scan(&free)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false
	}
	require.NoError(t, err)
	return true, free
}

// A completion that did not commit leaves the item to be done again:
// Complete afterwards must not say it was completed. Before, after a
// failed CompleteTx, Complete (or Release then Complete) returned nil
// while the item's row was still there and free.
func TestCompleteAfterFailedCompleteTx(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "worker", TTL: time.Minute})

	for _, tc := range []struct {
		what string
		// fail runs CompleteTx so that its completion does not commit.
		fail func(t *testing.T, item *leasetable.Lease)
		// releaseFirst calls Release before Complete.
		releaseFirst bool
	}{
		{"statement failed", failedCompleteTx(ctx, pool, c), false},
		{"statement failed, then Release", failedCompleteTx(ctx, pool, c), true},
		{"transaction rolled back", func(t *testing.T, item *leasetable.Lease) {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			require.NoError(t, c.CompleteTx(ctx, tx, item))
			require.NoError(t, tx.Rollback(ctx))
			select { // the client learns how the transaction ended
			case <-item.Done():
			case <-time.After(30 * time.Second):
				t.Fatal("the rolled-back completion was not settled")
			}
		}, false},
	} {
		t.Run(tc.what, func(t *testing.T) {
			name := "item-" + tc.what
			_, err := c.Register(ctx, "after-tx-"+tc.what, name)
			require.NoError(t, err)
			items, err := c.Claim(ctx, "after-tx-"+tc.what, 1)
			require.NoError(t, err)
			require.Len(t, items, 1)
			item := items[0]
			tc.fail(t, item)
			if tc.releaseFirst {
				require.NoError(t, item.Release(ctx))
			}
			err = item.Complete(ctx)
			require.ErrorIs(t, err, leasetable.ErrNotHeld, "Complete after a completion that did not commit")
			err = c.Complete(ctx, item)
			require.ErrorIs(t, err, leasetable.ErrNotHeld, "Client.Complete after a completion that did not commit")
			exists, _ := itemRow(t, ctx, pool, name)
			assert.True(t, exists, "the item is not done: its row stays")
		})
	}
}

// failedCompleteTx runs CompleteTx in a transaction that is already
// aborted, so its statement fails, then rolls the transaction back.
func failedCompleteTx(ctx context.Context, pool *pgxpool.Pool, c *leasetable.Client) func(t *testing.T, item *leasetable.Lease) {
	return func(t *testing.T, item *leasetable.Lease) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "SELECT 1/0")
		require.Error(t, err)
		require.Error(t, c.CompleteTx(ctx, tx, item))
		require.NoError(t, tx.Rollback(ctx))
	}
}

// An item lost while its transaction runs (here force-released by an
// operator) stops the transaction's statements with context.Canceled, as
// pgx reports an ended context; the documented work loop's error says
// why: it wraps leasetable.ErrLeaseLost (docs/work-queues.md).
func TestWorkLoopSaysWhyAnItemWasLost(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	_, err := pool.Exec(ctx, "CREATE TABLE sent (mail text PRIMARY KEY)")
	require.NoError(t, err)
	c := newClient(t, pool, leasetable.Config{Owner: "mailer", TTL: 3 * time.Second})
	_, err = c.Register(ctx, "mail", "mail-1")
	require.NoError(t, err)
	items, err := c.Claim(ctx, "mail", 1)
	require.NoError(t, err)
	require.Len(t, items, 1)
	item := items[0]
	// The operator releases the item while the mail's INSERT waits for a
	// row lock the test holds.
	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer blocker.Rollback(ctx) //nolint:errcheck
	_, err = blocker.Exec(ctx, "INSERT INTO sent VALUES ('mail-1')")
	require.NoError(t, err)
	go func() {
		// Once the worker's INSERT waits, force-release the item.
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for ; ctx.Err() == nil; <-tick.C {
			var waiting bool
			if pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE query LIKE 'INSERT INTO sent%' AND wait_event_type = 'Lock')`).Scan(&waiting) == nil && waiting {
				_, _ = pool.Exec(ctx, "SELECT pgbaton.force_release_lease('mail-1', 'test: lost mid-way')")
				return
			}
		}
	}()
	err = sendOne(pool, c, item)
	require.Error(t, err)
	t.Logf("the work loop's error: %v", err)
	assert.ErrorIs(t, err, leasetable.ErrLeaseLost, "the error says the item was lost")
}
