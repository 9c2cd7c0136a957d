package leasetable_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// TestLeaseSetBadInput: an empty set, a name twice, an invalid name or too
// many names are refused before anything is sent, by both calls and by the
// SQL function.
func TestLeaseSetBadInput(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pool := env.DB(t).Pool(t)
	c := newClient(t, pool, leasetable.Config{Owner: "a"})
	many := make([]string, leasetable.MaxSetNames+1)
	for i := range many {
		many[i] = "n" + strconv.Itoa(i)
	}
	for what, names := range map[string][]string{
		"empty": nil, "twice": {"a", "b", "a"}, "empty name": {"a", ""}, "invalid utf-8": {"a", "\xff"}, "too many": many,
	} {
		for call, f := range map[string]func(context.Context, ...string) (*leasetable.LeaseSet, error){
			"TryAcquireAll": c.TryAcquireAll, "AcquireAll": c.AcquireAll,
		} {
			s, err := f(ctx, names...)
			assert.Nil(t, s, "%s %s", call, what)
			assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%s %s", call, what)
		}
	}
	assert.Zero(t, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease"), "rows made for bad input")
	for _, names := range [][]string{{}, {"a", "a"}, {"a", ""}} {
		_, err := pool.Exec(ctx, "SELECT * FROM pgbaton.try_acquire_all($1, 'psql', 1000)", names)
		assert.ErrorContains(t, err, "22023", "%q", names) // invalid_parameter_value
	}
}

// TestTryAcquireAllAllOrNothing: with one name of the set held elsewhere
// nothing is granted (the grants before it are rolled back); once it is
// free, every name is granted in one call, each with its own token, in
// byte order; Release frees them all.
func TestTryAcquireAllAllOrNothing(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pool := env.DB(t).Pool(t)
	a := newClient(t, pool, leasetable.Config{Owner: "a"})
	b := newClient(t, pool, leasetable.Config{Owner: "b"})
	lb, err := b.TryAcquire(ctx, "set/b")
	require.NoError(t, err)

	_, err = a.TryAcquireAll(ctx, "set/c", "set/b", "set/a")
	var held *leasetable.HeldError
	require.ErrorAs(t, err, &held)
	assert.Equal(t, "set/b", held.Name)
	assert.Equal(t, "b", held.Holder)
	assert.Zero(t, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE owner = 'a'"), "a holds part of the set")
	// The names before the refused one are free to others at once.
	lone, err := b.TryAcquire(ctx, "set/a")
	require.NoError(t, err)
	require.NoError(t, lone.Release(ctx))

	require.NoError(t, lb.Release(ctx))
	set, err := a.TryAcquireAll(ctx, "set/c", "set/b", "set/a")
	require.NoError(t, err)
	var names []string
	tokens := map[int64]bool{}
	for _, l := range set.Leases() {
		names = append(names, l.Name())
		assert.NoError(t, l.Err())
		tokens[l.Token()] = true
	}
	assert.Equal(t, []string{"set/a", "set/b", "set/c"}, names)
	assert.Len(t, tokens, 3, "each lease has its own token")
	assert.Greater(t, set.Lease("set/b").Token(), lb.Token())
	assert.Nil(t, set.Lease("set/x"))
	assert.NoError(t, set.Err())
	assert.Equal(t, 3, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE owner = 'a'"))

	require.NoError(t, set.Release(ctx))
	<-set.Done()
	assert.ErrorIs(t, set.Err(), leasetable.ErrReleased)
	assert.ErrorIs(t, context.Cause(set.Context()), leasetable.ErrReleased)
	assert.Zero(t, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE owner IS NOT NULL"))
}

// TestTryAcquireAllWaitersFirst: a free name that others wait for is
// refused, as TryAcquire refuses it (a free lease goes to the oldest
// waiter), and nothing of the set is held.
func TestTryAcquireAllWaitersFirst(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pool := env.DB(t).Pool(t)
	waiting := make(chan string, 16)
	a := newClient(t, pool, leasetable.Config{Owner: "a"})
	b := newClient(t, pool, leasetable.Config{Owner: "b"})
	w := newClient(t, pool, leasetable.Config{Owner: "w", Logger: logTo(waiting)})
	lb, err := b.TryAcquire(ctx, "q/2")
	require.NoError(t, err)
	got := goAcquire(func() (*leasetable.Lease, error) { return w.Acquire(ctx, "q/2") })
	require.Equal(t, "q/2", <-waiting)
	// Released: free, but w waits for it; a's set must not overtake w.
	// (w may take it at any instant after the release: either way a's set
	// is refused, by the waiter or by w's grant, which w keeps until the
	// end of the test.)
	require.NoError(t, lb.Release(ctx))
	_, err = a.TryAcquireAll(ctx, "q/1", "q/2")
	assert.ErrorIs(t, err, leasetable.ErrHeld)
	assert.Zero(t, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE owner = 'a'"))
	r := <-got
	require.NoError(t, r.err)
	require.NoError(t, r.l.Release(ctx))
}

// TestAcquireAllGivesBackOnCancel: a set that waits for its last name holds
// the names before it; when its context ends, they are given back before
// AcquireAll returns.
func TestAcquireAllGivesBackOnCancel(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pool := env.DB(t).Pool(t)
	waiting := make(chan string, 16)
	a := newClient(t, pool, leasetable.Config{Owner: "a", Logger: logTo(waiting)})
	b := newClient(t, pool, leasetable.Config{Owner: "b"})
	_, err := b.TryAcquire(ctx, "z")
	require.NoError(t, err)
	actx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := a.AcquireAll(actx, "z", "y", "x")
		got <- err
	}()
	require.Equal(t, "z", <-waiting)
	assert.Equal(t, 2, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE owner = 'a'"), "x and y held while z is waited for")
	cancel()
	assert.ErrorIs(t, <-got, context.Canceled)
	assert.Zero(t, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE owner = 'a'"), "a holds part of the set")
	// And nothing of a is queued any more.
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		return pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_waiter WHERE owner = 'a'") == 0, nil
	}, "a still queued")
}

// TestAcquireAllOppositeOrders: clients asking for the same names in
// opposite orders, over and over, never deadlock: every one gets its set
// every time, before a deadline far beyond what the work takes.
func TestAcquireAllOppositeOrders(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	pool := env.DB(t).Pool(t)
	orders := [][]string{{"a", "b", "c"}, {"c", "b", "a"}, {"b", "c", "a"}, {"c", "a", "b"}}
	const rounds = 25
	var wg sync.WaitGroup
	errs := make(chan error, len(orders))
	for i, names := range orders {
		c := newClient(t, pool, leasetable.Config{Owner: "c" + strconv.Itoa(i)})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				set, err := c.AcquireAll(ctx, names...)
				if err == nil {
					err = set.Release(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
}

// TestLeaseSetEndsWithFirstLease: the set's context ends when any of its
// leases ends, with that lease's cause.
func TestLeaseSetEndsWithFirstLease(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pool := env.DB(t).Pool(t)
	c := newClient(t, pool, leasetable.Config{Owner: "a"})
	set, err := c.AcquireAll(ctx, "one", "two")
	require.NoError(t, err)
	require.NoError(t, set.Lease("two").Release(ctx))
	<-set.Context().Done()
	assert.ErrorIs(t, context.Cause(set.Context()), leasetable.ErrReleased)
	assert.True(t, errors.Is(set.Err(), leasetable.ErrReleased))
	assert.NoError(t, set.Lease("one").Err(), "the other lease is still held")
	require.NoError(t, set.Release(ctx), "releasing the rest of the set")
	assert.ErrorIs(t, set.Lease("one").Err(), leasetable.ErrReleased)
}

// TestAcquireAllBehindKilledHolder: a set one of whose names a killed
// process held is granted once that grant's TTL runs out, with a larger
// token, the names before it held meanwhile.
func TestAcquireAllBehindKilledHolder(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	k := env.StartChild(t, "hold", d.URL, "set/killed", shortTTL.String())
	oldTok, err := strconv.ParseInt(k.Expect(t, "token", 30*time.Second), 10, 64)
	require.NoError(t, err)
	waiting := make(chan string, 16)
	c := newClient(t, pool, leasetable.Config{Owner: "taker", TTL: shortTTL, Logger: logTo(waiting)})
	got := make(chan *leasetable.LeaseSet, 1)
	go func() {
		set, err := c.AcquireAll(ctx, "set/killed", "set/first")
		assert.NoError(t, err)
		got <- set
	}()
	require.Equal(t, "set/killed", <-waiting)
	assert.Equal(t, 1, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE owner = 'taker'"), "set/first held while set/killed is waited for")
	killed := time.Now()
	k.Signal(t, syscall.SIGKILL)
	set := <-got
	require.NotNil(t, set)
	t.Logf("set granted %s after SIGKILL (TTL %s)", time.Since(killed), shortTTL)
	assert.Greater(t, set.Lease("set/killed").Token(), oldTok)
	assert.NoError(t, set.Err())
	require.NoError(t, set.Release(ctx))
}

// TestAcquireAllEarlyLeaseLost: when a lease the set took first is lost
// (force-released by an operator) while a later name is waited for,
// AcquireAll fails with ErrLeaseLost and gives back everything: the
// caller holds none of the set.
func TestAcquireAllEarlyLeaseLost(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pool := env.DB(t).Pool(t)
	waiting, lost := make(chan string, 16), make(chan struct{}, 1)
	a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: shortTTL, Logger: slog.New(lostHandler{waitHandler{waiting}, lost})})
	b := newClient(t, pool, leasetable.Config{Owner: "b"})
	lb, err := b.TryAcquire(ctx, "e/2")
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		_, err := a.AcquireAll(ctx, "e/2", "e/1")
		got <- err
	}()
	require.Equal(t, "e/2", <-waiting)
	_, err = pool.Exec(ctx, "SELECT pgbaton.force_release_lease('e/1', 'test: lost while the set waits')")
	require.NoError(t, err)
	// a's keeper learns of the loss at its next keep-alive; then e/2 is
	// given, and the set must not be.
	<-lost
	require.NoError(t, lb.Release(ctx))
	err = <-got
	assert.ErrorIs(t, err, leasetable.ErrLeaseLost)
	assert.Zero(t, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE owner = 'a'"), "a holds part of the set")
}

// lostHandler is waitHandler that also tells of a lease lost.
type lostHandler struct {
	waitHandler
	lost chan<- struct{}
}

func (h lostHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "pgbaton: lease lost" {
		select {
		case h.lost <- struct{}{}:
		default:
		}
	}
	return h.waitHandler.Handle(ctx, r)
}
