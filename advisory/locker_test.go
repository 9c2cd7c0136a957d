package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

func TestTryLockUnlock(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	a := newLocker(t, pool, advisory.Config{})
	b := newLocker(t, pool, advisory.Config{})
	ctx := pgtest.Context(t, time.Minute)

	for _, key := range []advisory.Key{advisory.Name("job:daily-export"), advisory.Int64(7), advisory.Pair(1, 2)} {
		lk, err := a.TryLock(ctx, key)
		require.NoError(t, err, key.String())
		require.NoError(t, lk.Err())
		_, err = b.TryLock(ctx, key)
		require.ErrorIs(t, err, advisory.ErrLocked, "other Locker, %s", key)
		_, err = a.TryLock(ctx, key)
		require.ErrorIs(t, err, advisory.ErrLocked, "same Locker: Postgres would re-enter, the Locker must not (%s)", key)
		_, err = b.TryRLock(ctx, key)
		require.ErrorIs(t, err, advisory.ErrLocked)

		require.NoError(t, lk.Unlock(ctx))
		require.ErrorIs(t, lk.Err(), advisory.ErrUnlocked)
		require.NotErrorIs(t, lk.Err(), advisory.ErrLockLost, "a normal unlock is not a loss")
		select {
		case <-lk.Done():
		default:
			t.Fatal("Done not closed after Unlock")
		}
		require.ErrorIs(t, lk.Unlock(ctx), advisory.ErrNotHeld)

		lk2, err := b.TryLock(ctx, key)
		require.NoError(t, err)
		require.NoError(t, lk2.Unlock(ctx))
	}
	// Int64(1) and Pair(0, 1) are different key spaces.
	l1, err := a.TryLock(ctx, advisory.Int64(1))
	require.NoError(t, err)
	l2, err := b.TryLock(ctx, advisory.Pair(0, 1))
	require.NoError(t, err)
	require.NoError(t, l1.Unlock(ctx))
	require.NoError(t, l2.Unlock(ctx))

	granted, _ := advisoryLocks(t, admin, d)
	require.Zero(t, granted)
}

func TestSharedLocks(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	a := newLocker(t, pool, advisory.Config{})
	b := newLocker(t, pool, advisory.Config{})
	ctx := pgtest.Context(t, time.Minute)
	key := advisory.Name("shared")

	r1, err := a.TryRLock(ctx, key)
	require.NoError(t, err)
	r2, err := a.TryRLock(ctx, key)
	require.NoError(t, err)
	r3, err := b.TryRLock(ctx, key)
	require.NoError(t, err)
	_, err = a.TryLock(ctx, key)
	require.ErrorIs(t, err, advisory.ErrLocked)
	_, err = b.TryLock(ctx, key)
	require.ErrorIs(t, err, advisory.ErrLocked)

	require.NoError(t, r1.Unlock(ctx))
	require.NoError(t, r2.Unlock(ctx))
	_, err = b.TryLock(ctx, key) // b's own reader still holds it
	require.ErrorIs(t, err, advisory.ErrLocked)
	require.NoError(t, r3.Unlock(ctx))

	w, err := a.TryLock(ctx, key)
	require.NoError(t, err)
	_, err = b.TryRLock(ctx, key)
	require.ErrorIs(t, err, advisory.ErrLocked)
	require.NoError(t, w.Unlock(ctx))
}

// Many goroutines of one Locker on few keys: never two holders of a key
// at once, although all locks share a session and Postgres would let the
// session take a key twice.
func TestGoroutineExclusion(t *testing.T) {
	d := env.DB(t)
	l := newLocker(t, d.Pool(t), advisory.Config{})
	ctx := pgtest.Context(t, time.Minute)
	var holders [3]atomic.Int32
	var wg sync.WaitGroup
	var failed atomic.Value
	for g := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				k := (g + i) % len(holders)
				var lk *advisory.Lock
				var err error
				if i%2 == 0 {
					lk, err = l.Lock(ctx, advisory.Int64(int64(k)))
				} else {
					lk, err = l.TryLock(ctx, advisory.Int64(int64(k)))
					if errors.Is(err, advisory.ErrLocked) {
						continue
					}
				}
				if err != nil {
					failed.Store(err)
					return
				}
				if n := holders[k].Add(1); n != 1 {
					failed.Store(errors.New("two holders of one key"))
				}
				time.Sleep(50 * time.Microsecond)
				holders[k].Add(-1)
				if err := lk.Unlock(ctx); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
	st := l.Stats()
	require.Zero(t, st.Held)
	require.Positive(t, st.Contended)
	t.Logf("%+v", st)
}

// Concurrent requests on one session share batches, and batches follow
// each other on the wire without waiting for the answer to the one before.
func TestPipelining(t *testing.T) {
	d := env.DB(t)
	l := newLocker(t, d.Pool(t), advisory.Config{MaxSessionsUnderLoad: 1})
	// A batch goes out while another is on the wire only when a caller
	// comes in that moment: on a loaded machine 800 requests can all miss
	// it (one CI run: 123 batches, none overlapped). A pipeline that never
	// overlaps misses it in every round.
	var st advisory.Stats
	for round := 1; round <= 20 && st.Pipelined == 0; round++ {
		tryUnlockLoop(t, l, 8, 50)
		st = l.Stats()
		require.GreaterOrEqual(t, st.Requests, int64(800*round))
	}
	require.Equal(t, 1, st.Sessions, "all on one session")
	require.Less(t, st.Batches, st.Requests, "no two requests shared a batch: %+v", st)
	require.Positive(t, st.Pipelined, "no batch was sent while another was on the wire: %+v", st)
	t.Logf("%+v: %.2f requests per batch, %.0f%% of batches overlapped another", st,
		float64(st.Requests)/float64(st.Batches), 100*float64(st.Pipelined)/float64(st.Batches))
}

// tryUnlockLoop runs goroutines that each take and release their own key
// rounds times.
func tryUnlockLoop(t *testing.T, l *advisory.Locker, goroutines, rounds int) {
	ctx := pgtest.Context(t, time.Minute)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for range rounds {
				lk, err := l.TryLock(ctx, advisory.Int64(int64(g)))
				if err != nil {
					t.Error(err)
					return
				}
				if err := lk.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// A Locker keeps a few concurrent callers on one pipelined session,
// spreads heavier load over MaxSessionsUnderLoad sessions, and keeps them:
// no session is opened and closed again at every lull.
func TestSpreadUnderLoad(t *testing.T) {
	d := env.DB(t)
	l := newLocker(t, d.Pool(t), advisory.Config{})
	tryUnlockLoop(t, l, 2, 100)
	st := l.Stats()
	require.Equal(t, 1, st.Sessions, "2 callers fit one session's pipeline: %+v", st)

	// 8 callers keep one backend busy: a second one (another server
	// core) takes part of them. It opens in the background, and on a
	// loaded machine the callers can finish before it is ready (one CI
	// run: Sessions 1, Connects 2): it is waited for, not timed.
	tryUnlockLoop(t, l, 8, 100)
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		st = l.Stats()
		return st.Sessions == 2, nil
	}, "8 callers spread over 2 sessions: %+v", &st)
	require.Zero(t, st.Held)
	require.Equal(t, int64(2), st.Connects, "%+v", st)

	tryUnlockLoop(t, l, 64, 20)
	st = l.Stats()
	require.Zero(t, st.Held)
	require.Equal(t, 2, st.Sessions, "64 callers stay on 2 sessions: %+v", st)
	require.Equal(t, int64(2), st.Connects, "%+v", st)

	tryUnlockLoop(t, l, 64, 20)
	st = l.Stats()
	require.Equal(t, 2, st.Sessions, "%+v", st)
	require.Equal(t, int64(2), st.Connects, "the second session was kept: %+v", st)
	t.Logf("%+v", st)
}

func TestCloseReleasesAll(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	l, err := advisory.New(pool, advisory.Config{MaxLocksPerSession: 10})
	require.NoError(t, err)
	var locks []*advisory.Lock
	for i := range 25 { // three sessions
		lk, err := l.TryLock(ctx, advisory.Int64(int64(i)))
		require.NoError(t, err)
		locks = append(locks, lk)
	}
	rl, err := l.TryRLock(ctx, advisory.Name("r"))
	require.NoError(t, err)
	locks = append(locks, rl)
	granted, _ := advisoryLocks(t, admin, d)
	require.Equal(t, 26, granted)
	var sessions int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_database d ON d.oid = l.database WHERE l.locktype = 'advisory' AND d.datname = $1`, d.Name).Scan(&sessions))
	require.Equal(t, 3, sessions, "MaxLocksPerSession 10 and 26 locks")

	// A waiter is cancelled by Close too.
	other := newLocker(t, pool, advisory.Config{})
	held, err := other.TryLock(ctx, advisory.Name("busy"))
	require.NoError(t, err)
	waitErr := make(chan error, 1)
	go func() {
		_, err := l.Lock(ctx, advisory.Name("busy"))
		waitErr <- err
	}()
	eventuallyWaiting(t, admin, d, 1)

	require.NoError(t, l.Close(ctx))
	require.ErrorIs(t, <-waitErr, pgbaton.ErrClosed)
	for _, lk := range locks {
		require.ErrorIs(t, lk.Err(), advisory.ErrLockLost)
		require.ErrorIs(t, lk.Err(), pgbaton.ErrClosed)
	}
	granted, waiting := advisoryLocks(t, admin, d)
	require.Equal(t, 1, granted, "only the other Locker's lock is left") // no Eventually: Close waits for it
	require.Zero(t, waiting)
	_, err = l.TryLock(ctx, advisory.Int64(1))
	require.ErrorIs(t, err, pgbaton.ErrClosed)
	require.NoError(t, l.Close(ctx), "Close twice")
	require.NoError(t, held.Unlock(ctx))
	require.NoError(t, other.Close(ctx))
	pool.Close()
	env.NoConnections(t, d)
}

func TestBadInput(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	_, err := advisory.New(nil, advisory.Config{})
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	for _, cfg := range []advisory.Config{
		{Namespace: "a/b"},
		{PingInterval: -time.Second},
		{PingTimeout: time.Millisecond},
		{MaxLocks: -1},
		{MaxLocksPerSession: -1},
		{MaxSessionsUnderLoad: -1},
	} {
		_, err := advisory.New(pool, cfg)
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%+v", cfg)
	}
	l := newLocker(t, pool, advisory.Config{})
	for _, key := range []advisory.Key{{}, advisory.Name(""), advisory.Name("bad\xff"), advisory.Name(string(make([]byte, 2000)))} {
		_, err := l.TryLock(ctx, key)
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, key.String())
		_, err = l.Lock(ctx, key)
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
		err = l.RunExclusive(ctx, key, func(context.Context) error { return nil }, advisory.RunOptions{})
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
		_, err = l.Elect(ctx, key)
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
		err = l.Campaign(ctx, key, advisory.Callbacks{OnStartedLeading: func(context.Context, int64) {}})
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	}
	//lint:ignore SA1012 nil context on purpose
	_, err = l.TryLock(nil, advisory.Int64(1)) //nolint:staticcheck
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	err = l.RunExclusive(ctx, advisory.Int64(1), nil, advisory.RunOptions{})
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	err = l.Campaign(ctx, advisory.Int64(1), advisory.Callbacks{})
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	err = l.XactTryLock(ctx, nil, advisory.Int64(1))
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)

	granted, _ := advisoryLocks(t, admin, d)
	require.Zero(t, granted)
	var names int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.advisory_name").Scan(&names))
	require.Zero(t, names, "bad input changes nothing")
}

func TestRegistry(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	l := newLocker(t, pool, advisory.Config{})
	ns := newLocker(t, pool, advisory.Config{Namespace: "billing"})
	for range 3 {
		lk, err := l.TryLock(ctx, advisory.Name("job:daily-export"))
		require.NoError(t, err)
		require.NoError(t, lk.Unlock(ctx))
	}
	lk, err := ns.TryLock(ctx, advisory.Name("job:daily-export"))
	require.NoError(t, err)
	require.NoError(t, lk.Unlock(ctx))

	rows, err := pool.Query(ctx, "SELECT key, namespace, name FROM pgbaton.advisory_name ORDER BY namespace")
	require.NoError(t, err)
	type row struct {
		Key       int64
		Namespace string
		Name      string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	require.Equal(t, []row{
		{golden[0].key, "", "job:daily-export"},
		{golden[3].key, "billing", "job:daily-export"},
	}, got)

	// A collision: another name stored under the key of "victim". Real
	// SHA-256 collisions cannot be made, so the check constraint is
	// dropped to plant one.
	_, err = pool.Exec(ctx, "ALTER TABLE pgbaton.advisory_name DROP CONSTRAINT advisory_name_key_matches")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO pgbaton.advisory_name (key, name) VALUES (pgbaton.advisory_key('victim'), 'impostor')")
	require.NoError(t, err)
	fresh := newLocker(t, pool, advisory.Config{})
	_, err = fresh.TryLock(ctx, advisory.Name("victim"))
	require.ErrorIs(t, err, advisory.ErrKeyCollision)
	require.ErrorContains(t, err, "impostor")
	admin := adminPool(t)
	granted, _ := advisoryLocks(t, admin, d)
	require.Zero(t, granted)
}

func TestNotMigrated(t *testing.T) {
	d := env.EmptyDB(t)
	l := newLocker(t, d.Pool(t), advisory.Config{})
	ctx := pgtest.Context(t, time.Minute)
	_, err := l.TryLock(ctx, advisory.Name("x"))
	require.ErrorIs(t, err, pgbaton.ErrNotMigrated)
	lk, err := l.TryLock(ctx, advisory.Int64(1)) // numeric keys need no schema
	require.NoError(t, err)
	require.NoError(t, lk.Unlock(ctx))
}

func TestRunExclusive(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	l := newLocker(t, pool, advisory.Config{})
	other := newLocker(t, pool, advisory.Config{})
	key := advisory.Name("job:run")

	ran := false
	require.NoError(t, l.RunExclusive(ctx, key, func(ctx context.Context) error {
		ran = true
		_, err := other.TryLock(ctx, key)
		require.ErrorIs(t, err, advisory.ErrLocked)
		return nil
	}, advisory.RunOptions{}))
	require.True(t, ran)

	// Skip if held.
	held, err := other.TryLock(ctx, key)
	require.NoError(t, err)
	err = l.RunExclusive(ctx, key, func(context.Context) error { t.Fatal("ran while held"); return nil }, advisory.RunOptions{})
	require.ErrorIs(t, err, advisory.ErrLocked)
	// Wait until released: released once the server shows the wait (a
	// release before it began, as a timer may do on a busy machine,
	// would not test the wait).
	waited := make(chan error, 1)
	go func() {
		waited <- l.RunExclusive(ctx, key, func(context.Context) error { return nil }, advisory.RunOptions{Wait: true})
	}()
	eventuallyWaiting(t, admin, d, 1)
	require.NoError(t, held.Unlock(ctx))
	require.NoError(t, <-waited)

	// fn's error comes back; the lock is released.
	boom := errors.New("boom")
	require.ErrorIs(t, l.RunExclusive(ctx, key, func(context.Context) error { return boom }, advisory.RunOptions{}), boom)
	// A panic unlocks, then continues.
	require.PanicsWithValue(t, "kaboom", func() {
		_ = l.RunExclusive(ctx, key, func(context.Context) error { panic("kaboom") }, advisory.RunOptions{})
	})
	granted, _ := advisoryLocks(t, admin, d)
	require.Zero(t, granted)
	lk, err := other.TryLock(ctx, key)
	require.NoError(t, err)
	require.NoError(t, lk.Unlock(ctx))
}

func TestXactLocks(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	l := newLocker(t, pool, advisory.Config{})
	key := advisory.Name("xact")

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, l.XactTryLock(ctx, tx, key))
	_, err = l.TryLock(ctx, key)
	require.ErrorIs(t, err, advisory.ErrLocked)
	tx2, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.ErrorIs(t, l.XactTryLock(ctx, tx2, key), advisory.ErrLocked)
	require.ErrorIs(t, l.XactTryRLock(ctx, tx2, key), advisory.ErrLocked)
	// XactLock waits until the first transaction ends.
	got := make(chan error, 1)
	go func() { got <- l.XactLock(ctx, tx2, key) }()
	eventuallyWaiting(t, admin, d, 1) // waiting on the server, not just slow to start
	select {
	case err := <-got:
		t.Fatalf("XactLock returned while held: %v", err)
	default:
	}
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-got)
	require.NoError(t, tx2.Rollback(ctx))

	lk, err := l.TryLock(ctx, key)
	require.NoError(t, err, "released at commit/rollback")
	require.NoError(t, lk.Unlock(ctx))

	// Shared and pair variants.
	tx3, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, l.XactRLock(ctx, tx3, advisory.Pair(3, 4)))
	require.NoError(t, l.XactTryRLock(ctx, tx3, advisory.Pair(3, 4)))
	_, err = l.TryLock(ctx, advisory.Pair(3, 4))
	require.ErrorIs(t, err, advisory.ErrLocked)
	require.NoError(t, tx3.Rollback(ctx))
}

func TestElect(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	a := newLocker(t, pool, advisory.Config{})
	b := newLocker(t, pool, advisory.Config{})
	key := advisory.Name("leader")

	la, err := a.Elect(ctx, key)
	require.NoError(t, err)
	elected := make(chan *advisory.Leadership, 1)
	go func() {
		lb, err := b.Elect(ctx, key)
		if err == nil {
			elected <- lb
		}
	}()
	eventuallyWaiting(t, admin, d, 1) // b campaigns: its wait is on the server
	select {
	case <-elected:
		t.Fatal("two leaders")
	default:
	}
	require.NoError(t, la.Resign(ctx))
	<-la.Done()
	lb := <-elected
	require.NoError(t, lb.Err())
	require.NoError(t, lb.Resign(ctx))
}

func TestCampaign(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	a := newLocker(t, pool, advisory.Config{PingInterval: 100 * time.Millisecond, RetryDelay: 10 * time.Millisecond})
	key := advisory.Int64(99)
	ctx, cancel := context.WithCancel(pgtest.Context(t, time.Minute))
	started := make(chan context.Context, 10)
	stopped := make(chan struct{}, 10)
	campaign := make(chan error, 1)
	go func() {
		campaign <- a.Campaign(ctx, key, advisory.Callbacks{
			OnStartedLeading: func(ctx context.Context, _ int64) {
				started <- ctx
				<-ctx.Done()
			},
			OnStoppedLeading: func() { stopped <- struct{}{} },
		})
	}()
	term := <-started
	// Lose leadership: kill the session's backend. Campaign notices, ends
	// the term and wins again on a new session.
	env.Terminate(t, holderPID(t, admin, d, 99))
	<-term.Done()
	require.ErrorIs(t, context.Cause(term), advisory.ErrLockLost)
	<-stopped
	term2 := <-started
	require.NoError(t, term2.Err())
	cancel()
	require.ErrorIs(t, <-campaign, context.Canceled)
	<-stopped
	granted, _ := advisoryLocks(t, admin, d)
	require.Zero(t, granted)
}

func TestCheck(t *testing.T) {
	d := env.DB(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	l := newLocker(t, d.Pool(t), advisory.Config{})
	require.NoError(t, l.Check(ctx))
	lk, err := l.TryLock(ctx, advisory.Int64(1))
	require.NoError(t, err)
	env.Terminate(t, holderPID(t, admin, d, 1))
	<-lk.Done()
	require.NoError(t, l.Check(ctx), "a new session replaces the lost one")
	require.NoError(t, l.Close(ctx))
	require.ErrorIs(t, l.Check(ctx), pgbaton.ErrClosed)
}

// Every kind of blocking wait: exclusive and shared, bigint and pair keys.
func TestWaitVariants(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	holder := newLocker(t, pool, advisory.Config{})
	waiter := newLocker(t, pool, advisory.Config{})
	for _, c := range []struct {
		key    advisory.Key
		shared bool
	}{
		{advisory.Int64(8), false}, {advisory.Int64(9), true},
		{advisory.Pair(8, 1), false}, {advisory.Pair(8, 2), true},
	} {
		held, err := holder.TryLock(ctx, c.key)
		require.NoError(t, err)
		lock := waiter.Lock
		if c.shared {
			lock = waiter.RLock
		}
		lk := handOver(t, admin, d, held, lock, c.key)
		require.Equal(t, c.key, lk.Key())
		require.Equal(t, c.shared, lk.Shared())
		_, err = holder.TryLock(ctx, c.key)
		require.ErrorIs(t, err, advisory.ErrLocked, c.key.String())
		require.NoError(t, lk.Unlock(ctx))
	}
	granted, _ := advisoryLocks(t, admin, d)
	require.Zero(t, granted)
}

// Repeated waits reuse the connections of idle sessions instead of opening
// a connection (a new backend) for each.
func TestWaitsReuseConnections(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	a := newLocker(t, pool, advisory.Config{})
	b := newLocker(t, pool, advisory.Config{})
	key := advisory.Int64(55)
	held, err := a.TryLock(ctx, key)
	require.NoError(t, err)
	const rounds = 12
	for i := range rounds {
		// The other Locker waits; the holder hands over.
		waiter := b
		if i%2 == 1 {
			waiter = a
		}
		held = handOver(t, admin, d, held, waiter.Lock, key)
	}
	require.NoError(t, held.Unlock(ctx))
	for _, l := range []*advisory.Locker{a, b} {
		st := l.Stats()
		require.LessOrEqual(t, st.Connects, int64(4), "%+v", st)
	}
	t.Logf("connects: %d and %d for %d waits", a.Stats().Connects, b.Stats().Connects, rounds)
}

// Every connection a Locker holds locks on names pgbaton and the owner in
// application_name, so pg_stat_activity (and `pgbaton locks`) shows which
// process holds which lock; the default owner is host:pid.
func TestApplicationNameShowsOwner(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	appName := func(pid uint32) string {
		var name string
		require.NoError(t, admin.QueryRow(ctx, "SELECT application_name FROM pg_stat_activity WHERE pid = $1", int32(pid)).Scan(&name))
		return name
	}
	l := newLocker(t, pool, advisory.Config{Owner: "billing-worker-7"})
	lk, err := l.TryLock(ctx, advisory.Int64(61))
	require.NoError(t, err)
	require.Equal(t, "pgbaton advisory billing-worker-7", appName(holderPID(t, admin, d, 61)))

	// A lock granted after a wait is on the wait's connection: named too.
	def := newLocker(t, pool, advisory.Config{})
	waited := handOver(t, admin, d, lk, def.Lock, advisory.Int64(61))
	host, err := os.Hostname()
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("pgbaton advisory %s:%d", host, os.Getpid()), appName(holderPID(t, admin, d, 61)))
	require.NoError(t, waited.Unlock(ctx))

	for _, bad := range []string{"tab\there", string(make([]byte, 200))} {
		_, err := advisory.New(pool, advisory.Config{Owner: bad})
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	}
}
