package leasetable_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// Counts tells free, held and expired items apart in one call, and a
// group whose items are all completed is drained.
func TestCountsOfAGroup(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	a := newClient(t, pool, leasetable.Config{Owner: "a"})
	b := newClient(t, pool, leasetable.Config{Owner: "b"})

	got, err := a.Counts(ctx, "batch")
	require.NoError(t, err)
	assert.Equal(t, leasetable.GroupCounts{}, got)
	assert.True(t, got.Drained(), "a group nobody registered anything in")

	_, err = a.Register(ctx, "batch", "i1", "i2", "i3", "i4", "i5")
	require.NoError(t, err)
	held, err := a.Claim(ctx, "batch", 2)
	require.NoError(t, err)
	// A worker that died holding an item: claimed for 1 ms by a process
	// that will never give it back.
	_, err = pool.Exec(ctx, "SELECT pgbaton.claim('batch', 'dead-worker', 1, 1)")
	require.NoError(t, err)

	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		got, err = b.Counts(ctx, "batch")
		return got.Expired == 1, err
	}, "the dead worker's item never counted as expired")
	assert.Equal(t, leasetable.GroupCounts{Free: 2, Held: 2, Expired: 1}, got)
	assert.False(t, got.Drained())
	assert.Equal(t, 5, got.Total())

	// The same answer in SQL, for other languages and for dashboards.
	var free, heldN, expired int
	require.NoError(t, pool.QueryRow(ctx, "SELECT free, held, expired FROM pgbaton.group_counts('batch')").Scan(&free, &heldN, &expired))
	assert.Equal(t, []int{2, 2, 1}, []int{free, heldN, expired})

	rest, err := a.Claim(ctx, "batch", 10)
	require.NoError(t, err)
	require.Len(t, rest, 3, "the two free items and the expired one")
	require.NoError(t, a.Complete(ctx, append(held, rest...)...))
	got, err = a.Counts(ctx, "batch")
	require.NoError(t, err)
	assert.True(t, got.Drained(), "%+v", got)

	_, err = a.Counts(ctx, "")
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
}

// ClaimUntilDrained hands out items like ClaimWait while any are left,
// waits while other workers hold the last ones (one may come back), and
// returns ErrDrained, at once and woken by the completion, when the group
// holds no item any more.
func TestClaimUntilDrained(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 2*time.Minute)
	w1 := newClient(t, pool, leasetable.Config{Owner: "w1", TTL: neverPoll, PollInterval: neverPoll})
	w2, waiting := claimWaiter(t, pool, leasetable.Config{Owner: "w2", TTL: neverPoll, PollInterval: neverPoll})

	// Nothing registered yet: drained. (Its waiter registration, removed
	// in the background, was at the head of the queue when the release
	// below woke it, and its removal found nothing free yet: the turn was
	// lost; see TestLeavingWaiterHandsOnAReleaseInFlight.)
	_, err := w2.ClaimUntilDrained(ctx, "batch", 1)
	require.ErrorIs(t, err, leasetable.ErrDrained, "nothing was ever registered")

	_, err = w1.Register(ctx, "batch", "i1", "i2", "i3")
	require.NoError(t, err)
	items, err := w1.ClaimUntilDrained(ctx, "batch", 3)
	require.NoError(t, err)
	require.Len(t, items, 3)

	type result struct {
		items []*leasetable.Lease
		err   error
	}
	run := func() <-chan result {
		got := make(chan result, 1)
		go func() {
			ls, err := w2.ClaimUntilDrained(ctx, "batch", 1)
			got <- result{ls, err}
		}()
		return got
	}
	await := func(got <-chan result, why string) result {
		t.Helper()
		select {
		case r := <-got:
			return r
		case <-time.After(30 * time.Second):
			t.Fatal(why)
			return result{}
		}
	}

	// w1 holds every item: w2 waits, and gets one w1 gives back.
	got := run()
	require.Equal(t, "batch", <-waiting)
	require.NoError(t, items[0].Release(ctx))
	r := await(got, "ClaimUntilDrained not woken by a release")
	require.NoError(t, r.err)
	require.Len(t, r.items, 1)
	assert.Equal(t, "i1", r.items[0].Name())
	require.NoError(t, r.items[0].Complete(ctx))

	// w1 completes one of its two: one is left, held, so w2 still waits;
	// the last completion ends its wait with ErrDrained.
	got = run()
	require.Equal(t, "batch", <-waiting)
	require.NoError(t, w1.Complete(ctx, items[1]))
	select {
	case r := <-got:
		t.Fatalf("returned while an item was still held: %v %v", r.items, r.err)
	default:
	}
	require.NoError(t, w1.Complete(ctx, items[2]))
	r = await(got, "ClaimUntilDrained not woken by the last completion")
	assert.ErrorIs(t, r.err, leasetable.ErrDrained)
	assert.Empty(t, r.items)

	// A CompleteTx that drains the group wakes it when it commits.
	_, err = w1.Register(ctx, "batch", "i4")
	require.NoError(t, err)
	items, err = w1.Claim(ctx, "batch", 1)
	require.NoError(t, err)
	got = run()
	require.Equal(t, "batch", <-waiting)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w1.CompleteTx(ctx, tx, items[0]))
	require.NoError(t, tx.Commit(ctx))
	r = await(got, "ClaimUntilDrained not woken by the CompleteTx that drained the group")
	assert.ErrorIs(t, r.err, leasetable.ErrDrained)

	// A look while the last item's completion is in flight (its
	// transaction open) waits for that transaction instead of taking the
	// item for held and sleeping.
	_, err = w1.Register(ctx, "batch", "i5")
	require.NoError(t, err)
	items, err = w1.Claim(ctx, "batch", 1)
	require.NoError(t, err)
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w1.CompleteTx(ctx, tx, items[0]))
	got = run()
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		return pgtest.Count(t, pool, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%group_drained%'") == 1, nil
	}, "the look did not wait for the completion in flight")
	require.NoError(t, tx.Commit(ctx))
	r = await(got, "ClaimUntilDrained did not end when the completion in flight committed")
	assert.ErrorIs(t, r.err, leasetable.ErrDrained)

	_, err = w2.ClaimUntilDrained(ctx, "", 1)
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		return pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_waiter") == 0, nil
	}, "waiter registrations left behind")
}
