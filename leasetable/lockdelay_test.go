package leasetable_test

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// lostGrant is what the database shows of a lost grant in its lock-delay.
type lostGrant struct {
	token          int64
	expiry, freeAt time.Time
}

// awaitLockDelay waits until name's grant token has expired and is in its
// lock-delay, and returns its expiry and the delay's end (database clock).
func awaitLockDelay(t *testing.T, pool *pgxpool.Pool, name string, token int64) lostGrant {
	t.Helper()
	g := lostGrant{token: token}
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		var until *time.Time
		err := pool.QueryRow(context.Background(),
			"SELECT expires_at, lock_delay_until FROM pgbaton.lease_status WHERE name = $1 AND token = $2 AND NOT held",
			name, token).Scan(&g.expiry, &until)
		if err != nil || until == nil {
			return false, nil
		}
		g.freeAt = *until
		return true, nil
	}, "grant %d of %q in lock-delay", token, name)
	return g
}

// acquiredAt is when grant token of name was made, by the database clock.
func acquiredAt(t *testing.T, pool *pgxpool.Pool, name string, token int64) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT acquired_at FROM pgbaton.lease WHERE name = $1 AND token = $2", name, token).Scan(&at))
	return at
}

// A holder SIGSTOPped past its lease: nobody is granted the lease before
// its expiry plus the lock-delay the holder chose, though a waiter waits
// for it all along, and the waiter is granted it soon after (woken at the
// delay's end, not polling). In the odd runs the holder is resumed during
// the delay: it finds its lease lost and gives it back, as a deferred
// Release does, and that keeps the delay.
func TestLockDelayHolderStoppedPastItsLease(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 3*time.Minute)
	const ttl, delay, runs = time.Second, 2 * time.Second, 4
	looks := make(chan string, 1000) // the waiter's looks that found the lease not free
	c := newClient(t, pool, leasetable.Config{Owner: "next", TTL: ttl, Logger: logTo(looks)})
	var late []time.Duration
	var waits []int
	for i := range runs {
		name := fmt.Sprintf("stopped-%d", i)
		k := env.StartChild(t, "hold", d.URL, name, ttl.String(), delay.String())
		tok, err := strconv.ParseInt(k.Expect(t, "token", 30*time.Second), 10, 64)
		require.NoError(t, err)
		k.Signal(t, syscall.SIGSTOP)

		got := make(chan *leasetable.Lease, 1)
		go func() {
			l, err := c.Acquire(ctx, name)
			assert.NoError(t, err)
			got <- l
		}()
		lost := awaitLockDelay(t, pool, name, tok)
		assert.Equal(t, delay, lost.freeAt.Sub(lost.expiry), "the delay the holder chose")
		_, err = c.TryAcquire(ctx, name)
		var held *leasetable.HeldError
		require.ErrorAs(t, err, &held, "in lock-delay")
		assert.True(t, held.LockDelay)
		assert.Equal(t, tok, held.Token)
		assert.True(t, lost.freeAt.Equal(held.ExpiresAt), "HeldError.ExpiresAt %s, the delay's end %s", held.ExpiresAt, lost.freeAt)
		assert.Contains(t, err.Error(), "lock-delay until")
		if i%2 == 1 {
			k.Signal(t, syscall.SIGCONT)
			assert.Contains(t, k.Expect(t, "ended", 10*time.Second), "lease lost")
			assert.Equal(t, "<nil>", k.Expect(t, "released", 10*time.Second), "a lost grant is given back")
			_, err = c.TryAcquire(ctx, name)
			if time.Now().Before(lost.freeAt.Add(-200 * time.Millisecond)) { // compare only well inside the delay
				require.ErrorIs(t, err, leasetable.ErrHeld, "giving back a lost grant keeps its lock-delay")
			}
		}

		l := <-got
		require.NotNil(t, l)
		at := acquiredAt(t, pool, name, l.Token())
		require.False(t, at.Before(lost.freeAt), "granted at %s, before the lock-delay ended at %s", at, lost.freeAt)
		late = append(late, at.Sub(lost.freeAt))
		waits = append(waits, len(looks))
		for range len(looks) {
			<-looks
		}
		require.NoError(t, l.Release(ctx))
		if i%2 == 1 {
			require.NoError(t, k.Wait(t, 10*time.Second), k.Stderr())
		} else {
			k.Signal(t, syscall.SIGKILL)
		}
	}
	t.Logf("next grant after expiry + lock-delay (%s): %v; looks of the waiter before it: %v", delay, late, waits)
	for i, d := range late {
		assert.Less(t, d, ttl, "the waiter is woken when the delay ends")
		// One to the holder's expiry, one to the delay's end: it neither
		// polls nor spins (a look more for a wake-up is allowed).
		assert.LessOrEqual(t, waits[i], 3, "the waiter looked %d times", waits[i])
	}
}

// A holder that releases frees the lease at once, whatever its lock-delay:
// a waiter is granted it within milliseconds.
func TestLockDelayReleaseFreesAtOnce(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	holder := newClient(t, pool, leasetable.Config{Owner: "holder", LockDelay: leasetable.MaxLockDelay})
	waiting := make(chan string, 8)
	waiter := newClient(t, pool, leasetable.Config{Owner: "waiter", Logger: logTo(waiting)})
	const runs = 5
	var took []time.Duration
	for i := range runs {
		name := fmt.Sprintf("released-%d", i)
		l, err := holder.Acquire(ctx, name)
		require.NoError(t, err)
		got := make(chan *leasetable.Lease, 1)
		go func() {
			l, err := waiter.Acquire(ctx, name)
			assert.NoError(t, err)
			got <- l
		}()
		require.Equal(t, name, <-waiting)
		start := time.Now()
		require.NoError(t, l.Release(ctx))
		w := <-got
		took = append(took, time.Since(start))
		require.NotNil(t, w)
		require.NoError(t, w.Release(ctx))
	}
	t.Logf("release -> next grant with LockDelay %s: %v (p50 %s)", leasetable.MaxLockDelay, took, percentile(took, 50))
	for _, d := range took {
		assert.Less(t, d, 5*time.Second, "a release frees the lease at once, not after its lock-delay")
	}
}

// forceRelease runs pgbaton.force_release_lease as an operator does and
// returns when the name may be granted again.
func forceRelease(t *testing.T, pool *pgxpool.Pool, name string, clear bool) (time.Time, error) {
	t.Helper()
	var at *time.Time
	err := pool.QueryRow(context.Background(),
		"SELECT lock_delay_until FROM pgbaton.force_release_lease($1, 'test', $2)", name, clear).Scan(&at)
	if at == nil {
		return time.Time{}, err
	}
	return *at, err
}

// A forced release keeps the holder's lock-delay unless told to clear it;
// clearing also ends a lock-delay under way.
func TestLockDelayForceRelease(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	holder := newClient(t, pool, leasetable.Config{Owner: "holder", LockDelay: 30 * time.Second})
	other := newClient(t, pool, leasetable.Config{Owner: "other"})

	// Kept: nobody gets it for the delay, counted from the release.
	l, err := holder.Acquire(ctx, "kept")
	require.NoError(t, err)
	before := time.Now()
	until, err := forceRelease(t, pool, "kept", false)
	require.NoError(t, err)
	assert.WithinDuration(t, before.Add(30*time.Second), until, 5*time.Second)
	_, err = other.TryAcquire(ctx, "kept")
	var held *leasetable.HeldError
	require.ErrorAs(t, err, &held)
	assert.True(t, held.LockDelay)
	assert.True(t, until.Equal(held.ExpiresAt), "HeldError.ExpiresAt %s, the delay's end %s", held.ExpiresAt, until)
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("the holder was not told of the forced release")
	}
	require.ErrorIs(t, l.Err(), leasetable.ErrLeaseLost)
	// Its Release after the loss neither errs into freeing it nor frees it.
	_ = l.Release(ctx)
	_, err = other.TryAcquire(ctx, "kept")
	require.ErrorIs(t, err, leasetable.ErrHeld, "the lost holder's Release does not end the lock-delay")

	// Forcing again without clearing: not held, in lock-delay: PB404.
	_, err = forceRelease(t, pool, "kept", false)
	require.ErrorContains(t, err, "lock-delay until")
	// Clearing ends the lock-delay under way.
	_, err = forceRelease(t, pool, "kept", true)
	require.NoError(t, err)
	o, err := other.TryAcquire(ctx, "kept")
	require.NoError(t, err)
	require.NoError(t, o.Release(ctx))

	// Cleared: free at once.
	_, err = holder.Acquire(ctx, "cleared")
	require.NoError(t, err)
	until, err = forceRelease(t, pool, "cleared", true)
	require.NoError(t, err)
	assert.True(t, until.IsZero(), "no lock-delay: %s", until)
	o, err = other.TryAcquire(ctx, "cleared")
	require.NoError(t, err)
	require.NoError(t, o.Release(ctx))

	// Without a lock-delay nothing changes: free at once.
	_, err = other.Acquire(ctx, "none")
	require.NoError(t, err)
	until, err = forceRelease(t, pool, "none", false)
	require.NoError(t, err)
	assert.True(t, until.IsZero())
	_, err = holder.TryAcquire(ctx, "none")
	require.NoError(t, err)
}

// Claims grant without a lock-delay, whatever the client's LockDelay: a
// crashed worker's item is claimed again at its expiry.
func TestLockDelayNotOnClaims(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "worker", LockDelay: 30 * time.Second})
	_, err := c.Register(ctx, "items", "a")
	require.NoError(t, err)
	ls, err := c.Claim(ctx, "items", 1)
	require.NoError(t, err)
	require.Len(t, ls, 1)
	require.Equal(t, 0, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease WHERE lock_delay_ms > 0"))
	_, err = pool.Exec(ctx, "UPDATE pgbaton.lease SET expires_at = clock_timestamp() - interval '1 ms', session_id = NULL WHERE name = 'a'")
	require.NoError(t, err)
	other := newClient(t, pool, leasetable.Config{Owner: "other"})
	again, err := other.Claim(ctx, "items", 1)
	require.NoError(t, err)
	require.Len(t, again, 1, "an expired item is claimed at once")
}

func TestLockDelayBadInput(t *testing.T) {
	pool := env.DB(t).Pool(t)
	for _, d := range []time.Duration{-time.Millisecond, leasetable.MaxLockDelay + time.Millisecond} {
		_, err := leasetable.New(context.Background(), pool, leasetable.Config{LockDelay: d})
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%s", d)
	}
	_, err := pool.Exec(context.Background(), "SELECT pgbaton.lease_attempt('x', 'o', 1000, p_lock_delay_ms => 60001)")
	require.Error(t, err)
	require.ErrorContains(t, err, "lock_delay_ms must be 0 to 60000")
}

// Closing (or pruning) a lease session unbinds its leases; a grant with a
// lock-delay keeps the session's expiry rather than falling back to its
// own, earlier one, so its delay is not brought forward. One without
// keeps only its own, as before.
func TestLockDelayKeptWhenItsSessionCloses(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	for _, delay := range []int64{0, 1000} {
		name := fmt.Sprintf("bound-%d", delay)
		var sid int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT id FROM pgbaton.session_open('o', 60000)").Scan(&sid))
		_, err := pool.Exec(ctx, "SELECT pgbaton.lease_attempt($1, 'o', 1, p_session => $2, p_lock_delay_ms => $3)", name, sid, delay)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, "SELECT pgbaton.session_close($1)", sid)
		require.NoError(t, err)
		n := pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_status WHERE name = $1 AND held", name)
		if delay > 0 {
			require.Equal(t, 1, n, "held until its session's expiry, then in lock-delay")
		} else {
			pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
				return pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_status WHERE name = $1 AND held", name) == 0, nil
			}, "%s held by its own 1ms expiry only", name)
		}
	}
}

// The failover grace waits out the longest TTL in use; a grant with a
// lock-delay counts its TTL plus the delay, so a grant the failover lost
// keeps its name from everyone for its delay too.
func TestLockDelayCountsInTheFailoverGrace(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "holder", TTL: time.Second, LockDelay: 5 * time.Second})
	l, err := c.Acquire(ctx, "graced")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	var ttl int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pgbaton.ttl_in_use()").Scan(&ttl))
	require.GreaterOrEqual(t, ttl, int64(6000))
}

// A lock set's grants carry the client's lock-delay like Acquire's, and a
// set refused by a name in lock-delay says so. Before, AcquireAll granted
// without one: a set lost by force was free again at once.
func TestLockDelayOnLockSets(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	holder := newClient(t, pool, leasetable.Config{Owner: "holder", LockDelay: 30 * time.Second})
	other := newClient(t, pool, leasetable.Config{Owner: "other"})

	set, err := holder.AcquireAll(ctx, "set-b", "set-a")
	require.NoError(t, err)
	before := time.Now()
	until, err := forceRelease(t, pool, "set-a", false)
	require.NoError(t, err)
	assert.WithinDuration(t, before.Add(30*time.Second), until, 5*time.Second)
	select {
	case <-set.Done():
	case <-ctx.Done():
		t.Fatal("the set did not end with its lost lease")
	}
	_, err = other.TryAcquireAll(ctx, "set-a", "set-b")
	var held *leasetable.HeldError
	require.ErrorAs(t, err, &held)
	assert.Equal(t, "set-a", held.Name)
	assert.True(t, held.LockDelay, "%v", err)
	assert.True(t, until.Equal(held.ExpiresAt), "HeldError.ExpiresAt %s, the delay's end %s", held.ExpiresAt, until)
	require.ErrorIs(t, set.Release(ctx), leasetable.ErrNotHeld, "set-a was lost")
}
