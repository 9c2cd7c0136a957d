package leasetable_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

const sigKill = syscall.SIGKILL

// heldBy returns the names of lease rows owner holds (expired or not).
func heldBy(t testing.TB, pool *pgxpool.Pool, owner string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT name FROM pgbaton.lease WHERE owner = $1 ORDER BY name", owner)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// A caller whose context ends while its grant is in flight either gets the
// lease or the grant is given back at once: never a row held for a caller
// that got an error. The caller gives up between the server's commit and
// the reply (giveUpWithReplyHeld).
func TestCancelledGrantIsGivenBack(t *testing.T) {
	if env.Cluster() == nil {
		t.Skip("needs the throwaway cluster") // only with PGBATON_TEST_DSN
	}
	ctx := pgtest.Context(t, time.Minute)
	direct, victim, pool, proxy := slowLinkWorker(t, ctx, "victim", "item-1", "item-2")
	sem, err := victim.Semaphore(ctx, "sem", 2) // registers the semaphore's slots
	require.NoError(t, err)
	require.NoError(t, sem.Release(ctx))

	const attempt, claim = "%pgbaton.lease_attempt(%", "%pgbaton.claim(%"
	calls := []struct {
		name, blocked string
		call          func(ctx context.Context) error
	}{
		{"TryAcquire", attempt, func(ctx context.Context) error { _, err := victim.TryAcquire(ctx, "named-1"); return err }},
		{"Acquire", attempt, func(ctx context.Context) error { _, err := victim.Acquire(ctx, "named-2"); return err }},
		{"Claim", claim, func(ctx context.Context) error { _, err := victim.Claim(ctx, "items", 2); return err }},
		{"CompleteAndClaim", claim, func(ctx context.Context) error {
			_, err := victim.CompleteAndClaim(ctx, "items", 2)
			return err
		}},
		{"Semaphore", claim, func(ctx context.Context) error { _, err := victim.Semaphore(ctx, "sem", 2); return err }},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pool.Exec(ctx, "SELECT 1") // a connection ready in the pool
			require.NoError(t, err)
			giveUpWithReplyHeld(t, ctx, direct, proxy, tc.blocked, tc.call, func() bool {
				return len(heldBy(t, direct, "victim")) > 0
			})
			pgtest.Eventually(t, 20*time.Second, func() (bool, error) {
				return len(heldBy(t, direct, "victim")) == 0, nil
			}, "rows still held by a caller that got an error: %v", heldBy(t, direct, "victim"))
		})
	}
}

// Cancelled Acquires racing a release, as a user's request timeout would:
// after each trial the waiter either holds the lease or holds nothing.
func TestCancelledAcquireRacingRelease(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 2*time.Minute)
	holder := newClient(t, pool, leasetable.Config{Owner: "holder", TTL: time.Minute})
	waiter := newClient(t, pool, leasetable.Config{Owner: "waiter", TTL: time.Minute})
	const trials = 60
	got, orphans := 0, 0
	for i := range trials {
		name := fmt.Sprintf("race-%d", i)
		h, err := holder.TryAcquire(ctx, name)
		require.NoError(t, err)
		wctx, cancel := context.WithCancel(ctx)
		res := make(chan *leasetable.Lease, 1)
		go func() {
			l, _ := waiter.Acquire(wctx, name)
			res <- l
		}()
		require.NoError(t, h.Release(ctx))
		// Cancel around the moment the waiter's grant is in flight.
		time.Sleep(time.Duration(rand.N(1500)) * time.Microsecond) // spreads the race window, not synchronisation
		cancel()
		l := <-res
		if l != nil {
			got++
			require.NoError(t, l.Release(ctx))
			continue
		}
		held := true
		deadline := time.Now().Add(2 * time.Second)
		for held && time.Now().Before(deadline) {
			held = len(heldBy(t, pool, "waiter")) > 0
			if held {
				time.Sleep(5 * time.Millisecond) // poll until given back, bounded
			}
		}
		if held {
			orphans++
		}
	}
	t.Logf("cancelled Acquire racing a release: %d trials, %d got the lease, %d errors, %d orphaned grants", trials, got, trials-got, orphans)
	assert.Zero(t, orphans, "grants left held by a waiter that returned an error")
}

// Release and Complete give the lease back even when the caller's context
// has already ended.
func TestReleaseWithEndedContext(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	c := newClient(t, pool, leasetable.Config{Owner: "c", TTL: time.Minute})
	_, err := c.Register(ctx, "items", "a", "b")
	require.NoError(t, err)

	ended, cancel := context.WithCancel(ctx)
	cancel()
	l, err := c.TryAcquire(ctx, "job")
	require.NoError(t, err)
	require.NoError(t, l.Release(ended))
	assert.Empty(t, heldBy(t, pool, "c"), "released at once")
	assert.ErrorIs(t, l.Err(), leasetable.ErrReleased)

	items, err := c.Claim(ctx, "items", 2)
	require.NoError(t, err)
	require.Len(t, items, 2)
	require.NoError(t, items[0].Complete(ended))
	require.NoError(t, c.Complete(ended, items[1]))
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease WHERE lease_group = 'items'").Scan(&n))
	assert.Zero(t, n, "completed at once")
}

// A release that could not reach the server is retried by Close, which
// says so if it still cannot.
func TestCloseGivesBackFailedReleases(t *testing.T) {
	if env.Cluster() == nil {
		t.Skip("needs the throwaway cluster") // only with PGBATON_TEST_DSN
	}
	d := env.DB(t)
	direct := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	pool, proxy := env.ProxiedPool(t, d)
	c, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "c", TTL: time.Minute, ReleaseTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	l1, err := c.TryAcquire(ctx, "one")
	require.NoError(t, err)
	l2, err := c.TryAcquire(ctx, "two")
	require.NoError(t, err)

	proxy.Stall()
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	require.Error(t, l1.Release(short), "the server is unreachable")
	assert.ErrorIs(t, l1.Err(), leasetable.ErrReleased, "the holder stops at once")
	// Read while the proxy still stalls: once it resumes, the client may
	// give "one" back on its own before Close does.
	assert.Equal(t, []string{"one", "two"}, heldBy(t, direct, "c"), "the release did not arrive")
	proxy.Cut() // the stalled release never arrives; new connections work
	proxy.Resume()
	require.NoError(t, c.Close(ctx))
	assert.Empty(t, heldBy(t, direct, "c"), "Close gave back the lease whose release failed, and the one still held")
	_ = l2

	// When Close cannot reach the server either, its error says which
	// leases stay held until their TTL.
	c2, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "c2", TTL: time.Minute, ReleaseTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	_, err = c2.TryAcquire(ctx, "three")
	require.NoError(t, err)
	proxy.Stall()
	err = c2.Close(short)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"three"`)
	proxy.Cut()
	proxy.Resume()
	assert.Equal(t, []string{"three"}, heldBy(t, direct, "c2"))
}

// Complete after Release or loss fails with ErrNotHeld: the item was not
// completed (and will be claimed again).
func TestCompleteAfterReleaseOrLoss(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	c := newClient(t, pool, leasetable.Config{Owner: "c", TTL: time.Minute})
	_, err := c.Register(ctx, "items", "a", "b", "c", "d")
	require.NoError(t, err)
	items, err := c.Claim(ctx, "items", 4)
	require.NoError(t, err)
	require.Len(t, items, 4)

	require.NoError(t, items[0].Release(ctx))
	err = items[0].Complete(ctx)
	require.ErrorIs(t, err, leasetable.ErrNotHeld)
	assert.Contains(t, err.Error(), "not completed")

	// Lost: an operator force-released it (the token moves on).
	_, err = pool.Exec(ctx, "SELECT pgbaton.force_release_lease('b', 'test')")
	require.NoError(t, err)
	require.ErrorIs(t, items[1].Renew(ctx), leasetable.ErrNotHeld)
	require.ErrorIs(t, items[1].Complete(ctx), leasetable.ErrNotHeld)

	// Client.Complete names the ones it did not complete.
	require.NoError(t, items[2].Release(ctx))
	err = c.Complete(ctx, items[2], items[3])
	require.ErrorIs(t, err, leasetable.ErrNotHeld)
	assert.Contains(t, err.Error(), `"c"`)
	assert.NotContains(t, err.Error(), `"d"`)

	var left []string
	rows, err := pool.Query(ctx, "SELECT name FROM pgbaton.lease WHERE lease_group = 'items' ORDER BY name")
	require.NoError(t, err)
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "c"}, left, "only d was completed")

	// Completing twice is not an error; releasing after completing is not
	// either.
	require.NoError(t, items[3].Complete(ctx))
	require.NoError(t, items[3].Release(ctx))
}

// Err and Done report the loss from the instant the local deadline has
// passed, not when a timer goroutine gets round to it.
func TestErrAtTheDeadline(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "c", TTL: 600 * time.Millisecond})
	for trial := range 5 {
		name := fmt.Sprintf("held-%d", trial)
		l, err := c.TryAcquire(ctx, name)
		require.NoError(t, err)
		// Keep-alives hang behind a row lock, so the deadline passes.
		unblock := pgtest.BlockKeepalives(t, pool, "c")
		awaitKeepaliveBlocked(t, pool, l)
		dl := l.Deadline()
		for time.Now().Before(dl) {
			runtime.Gosched() // look at the first instant past the deadline
		}
		err = l.Err()
		doneClosed := false
		select {
		case <-l.Done():
			doneClosed = true
		default:
		}
		ctxErr := l.Context().Err()
		unblock()
		require.ErrorIs(t, err, leasetable.ErrLeaseLost, "trial %d: Err at the deadline", trial)
		require.True(t, doneClosed, "trial %d: Done at the deadline", trial)
		require.Error(t, ctxErr, "trial %d: Context().Err() at the deadline", trial)
	}
}

// CompleteTx completes work items inside the caller's transaction: the
// effect and the completion commit together or not at all.
func TestCompleteTx(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	_, err := pool.Exec(ctx, "CREATE TABLE effect (item text)")
	require.NoError(t, err)
	c := newClient(t, pool, leasetable.Config{Owner: "c", TTL: 2 * time.Second})
	other := newClient(t, pool, leasetable.Config{Owner: "other", TTL: 2 * time.Second})
	_, err = c.Register(ctx, "items", "a", "b", "c")
	require.NoError(t, err)
	items, err := c.Claim(ctx, "items", 3)
	require.NoError(t, err)
	require.Len(t, items, 3)
	count := func(sql string, args ...any) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&n))
		return n
	}

	t.Run("bad input", func(t *testing.T) {
		require.ErrorIs(t, c.CompleteTx(ctx, nil, items[0]), pgbaton.ErrInvalidArgument)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		require.ErrorIs(t, c.CompleteTx(ctx, tx), pgbaton.ErrInvalidArgument)
		require.ErrorIs(t, c.CompleteTx(ctx, tx, nil), pgbaton.ErrInvalidArgument)
		require.ErrorIs(t, other.CompleteTx(ctx, tx, items[0]), pgbaton.ErrInvalidArgument)
		assert.NoError(t, items[0].Err(), "bad input ends nothing")
	})

	t.Run("commit", func(t *testing.T) {
		err := pgx.BeginFunc(items[0].Context(), pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO effect VALUES ('a')"); err != nil {
				return err
			}
			return c.CompleteTx(ctx, tx, items[0])
		})
		require.NoError(t, err, "the lease's own context stays usable for the commit")
		assert.Equal(t, 1, count("SELECT count(*) FROM effect WHERE item = 'a'"))
		assert.Zero(t, count("SELECT count(*) FROM pgbaton.lease WHERE name = 'a'"))
		// Renewal stopped; the lease ends as released, not lost.
		select {
		case <-items[0].Done():
		case <-time.After(5 * time.Second):
			t.Fatal("a lease completed in a transaction never ended")
		}
		assert.ErrorIs(t, items[0].Err(), leasetable.ErrReleased)
		require.NoError(t, items[0].Release(ctx), "releasing after a committed completion is a no-op")
	})

	t.Run("rollback", func(t *testing.T) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "INSERT INTO effect VALUES ('b')")
		require.NoError(t, err)
		require.NoError(t, c.CompleteTx(ctx, tx, items[1]))
		require.NoError(t, tx.Rollback(ctx))
		assert.Zero(t, count("SELECT count(*) FROM effect WHERE item = 'b'"))
		// The item comes back after its TTL (renewal has stopped).
		pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
			ls, err := other.Claim(ctx, "items", 1)
			if err != nil || len(ls) == 0 {
				return false, err
			}
			return ls[0].Name() == "b", ls[0].Release(ctx)
		}, "a rolled-back completion's item was not claimable again")
	})

	t.Run("taken over", func(t *testing.T) {
		_, err := pool.Exec(ctx, "SELECT pgbaton.force_release_lease('c', 'test')")
		require.NoError(t, err)
		taken, err := other.Claim(ctx, "items", 2)
		require.NoError(t, err)
		names := []string{}
		for _, l := range taken {
			names = append(names, l.Name())
		}
		require.Contains(t, names, "c")
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		_, err = tx.Exec(ctx, "INSERT INTO effect VALUES ('c')")
		require.NoError(t, err)
		err = c.CompleteTx(ctx, tx, items[2])
		require.ErrorIs(t, err, leasetable.ErrNotHeld)
		assert.Contains(t, err.Error(), `"c"`)
		// The transaction is aborted: even a commit writes nothing.
		require.Error(t, tx.Commit(ctx))
		assert.Zero(t, count("SELECT count(*) FROM effect WHERE item = 'c'"))
		for _, l := range taken {
			require.NoError(t, l.Release(ctx))
		}
	})
}

// childWorker works through group args[1] in batches of args[2]. With
// args[3] "tx", each item's effect and its completion commit in one
// transaction (CompleteTx); with "after", the effects commit first and the
// batch is completed afterwards with CompleteAndClaim, the loop the README
// showed before CompleteTx existed.
func childWorker(ctx context.Context, args []string) error {
	c, closeFn, err := childClient(ctx, args[0], time.Second)
	if err != nil {
		return err
	}
	defer closeFn()
	pool, err := pgxpool.New(ctx, args[0])
	if err != nil {
		return err
	}
	defer pool.Close()
	var batch int
	fmt.Sscan(args[2], &batch)
	inTx := args[3] == "tx"
	effect := func(ctx context.Context, q interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}, l *leasetable.Lease) error {
		_, err := q.Exec(ctx, "INSERT INTO effect (item, worker) VALUES ($1, $2)", l.Name(), c.Owner())
		time.Sleep(time.Duration(5+rand.N(20)) * time.Millisecond) // the work takes a while: a kill can land mid-item
		return err
	}
	pgtest.Printf("ready")
	items, err := c.Claim(ctx, args[1], batch)
	for {
		if err != nil && !errors.Is(err, leasetable.ErrNotHeld) {
			return err
		}
		if len(items) == 0 {
			time.Sleep(20 * time.Millisecond) // an idle worker looks again later; not synchronisation
			items, err = c.Claim(ctx, args[1], batch)
			continue
		}
		var done []*leasetable.Lease
		for _, l := range items {
			if inTx {
				err := pgx.BeginFunc(l.Context(), pool, func(tx pgx.Tx) error {
					if err := effect(ctx, tx, l); err != nil {
						return err
					}
					return c.CompleteTx(ctx, tx, l)
				})
				if err != nil && !errors.Is(err, leasetable.ErrNotHeld) && !errors.Is(err, leasetable.ErrLeaseLost) && !errors.Is(err, context.Canceled) {
					return err
				}
				continue
			}
			if err := effect(ctx, pool, l); err != nil {
				return err
			}
			done = append(done, l)
		}
		if inTx {
			items, err = c.Claim(ctx, args[1], batch)
		} else {
			items, err = c.CompleteAndClaim(ctx, args[1], batch, done...)
		}
	}
}

// The kill storm's size: `make storm` runs it long and many times; the
// defaults are the short run of `make test`.
var (
	stormItems    = flag.Int("storm.items", 600, "TestExactlyOnceEffectsUnderKills: items in the queue")
	stormDuration = flag.Duration("storm.duration", 0, "TestExactlyOnceEffectsUnderKills: keep killing for this long (0: until the queue is empty)")
	stormRuns     = flag.Int("storm.runs", 1, "TestExactlyOnceEffectsUnderKills: runs in a row")
	stormPace     = flag.Duration("storm.pace", 50*time.Millisecond, "TestExactlyOnceEffectsUnderKills: shortest time between kills (the longest is 200ms more)")
)

// Workers in child processes are SIGKILLed at random while they work
// through the items: with CompleteTx every item still has exactly one
// effect, and no lease row is left. The control run, which commits effects
// before completing them, shows that the kills do double work.
func TestExactlyOnceEffectsUnderKills(t *testing.T) {
	t.Run("CompleteTx", func(t *testing.T) {
		for run := 1; run <= *stormRuns; run++ {
			s := workUnderKills(t, "tx", *stormItems, *stormDuration)
			t.Logf("exactly-once run %d/%d (CompleteTx): %d items, 3 workers, %d kills in %s, %d doubled, %d missing, %d lease rows left",
				run, *stormRuns, *stormItems, s.kills, s.took.Round(time.Second), s.doubled, s.missing, s.left)
			assert.GreaterOrEqual(t, s.kills, 10, "the nemesis must have struck")
			assert.Zero(t, s.doubled, "items with more than one effect")
			assert.Zero(t, s.missing, "items without an effect")
			assert.Zero(t, s.left, "lease rows left")
			if t.Failed() {
				return
			}
		}
	})
	t.Run("control: complete after commit", func(t *testing.T) {
		s := workUnderKills(t, "after", 300, 0)
		t.Logf("control run (effects committed, then CompleteAndClaim): 300 items, 3 workers, %d kills, %d doubled, %d missing", s.kills, s.doubled, s.missing)
		assert.Positive(t, s.doubled, "the kills should have doubled some items: the check could not fail")
		assert.Zero(t, s.missing)
	})
}

type stormResult struct {
	kills, doubled, missing, left int
	took                          time.Duration
}

// workUnderKills has three workers work through items in mode while one
// of them is killed every stormPace to stormPace+200ms: until the queue
// is empty, or for storm when that is longer (the queue is filled again
// as it empties). Then the workers finish the queue in peace, and it
// counts what happened.
func workUnderKills(t *testing.T, mode string, items int, storm time.Duration) (r stormResult) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 4*time.Minute+storm)
	const workers = 3
	_, err := pool.Exec(ctx, "CREATE TABLE effect (item text NOT NULL, worker text NOT NULL)")
	require.NoError(t, err)
	reg := newClient(t, pool, leasetable.Config{})
	registered := 0
	register := func() {
		names := make([]string, items)
		for i := range names {
			names[i] = fmt.Sprintf("item-%06d", registered+i)
		}
		_, err = reg.Register(ctx, "queue", names...)
		require.NoError(t, err)
		registered += items
	}
	register()

	start := func() *pgtest.Child {
		k := env.StartChild(t, "worker", d.URL, "queue", "5", mode)
		k.Expect(t, "ready", 30*time.Second)
		return k
	}
	ws := make([]*pgtest.Child, workers)
	for i := range ws {
		ws[i] = start()
	}
	remaining := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease WHERE lease_group = 'queue'").Scan(&n))
		return n
	}
	began := time.Now()
	for {
		require.NoError(t, ctx.Err(), "items left: %d", remaining())
		time.Sleep(*stormPace + time.Duration(rand.N(200))*time.Millisecond) // the nemesis's pace
		if left := remaining(); left < items/10 && time.Since(began) < storm {
			register() // keep the storm going on a full queue
		} else if left == 0 || time.Since(began) >= storm && storm > 0 {
			break
		}
		i := rand.N(workers)
		ws[i].Signal(t, sigKill)
		<-ws[i].Done()
		r.kills++
		ws[i] = start()
	}
	r.took = time.Since(began)
	// The storm is over: the workers finish the queue. A row that stays
	// is a lease row left behind.
	deadline := time.Now().Add(2 * time.Minute)
	for remaining() > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond) // polling the queue, not synchronisation
	}
	require.NoError(t, pool.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE n > 1), $1 - count(*) FROM (SELECT item, count(*) AS n FROM effect GROUP BY item) e`, registered).Scan(&r.doubled, &r.missing))
	r.left = remaining()
	return r
}

// Claim hands out the oldest available item first, so a crashed worker's
// item is retried within about TTL + renew interval, not after every item
// that was never claimed. Counted, not timed: the item is free again at
// most a TTL (2 s) after the kill, when at most 2 s / 150 ms of the other
// items were claimed (fewer on a loaded machine), against all 59 of them
// if the never-claimed went first.
func TestCrashedWorkersItemRetriedFirst(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	const ttl = 2 * time.Second
	names := make([]string, 60)
	for i := range names {
		names[i] = fmt.Sprintf("item-%02d", i)
	}
	w := newClient(t, pool, leasetable.Config{Owner: "w", TTL: ttl})
	_, err := w.Register(ctx, "queue", names...)
	require.NoError(t, err)
	k := env.StartChild(t, "claimer", d.URL, "queue", "1", ttl.String())
	victim := k.Expect(t, "claimed", 30*time.Second)
	assert.Equal(t, "item-00", victim, "the oldest item first")
	k.Signal(t, sigKill)
	killed := time.Now()
	var back time.Duration
	before := 0 // items claimed before the killed worker's came back
	for back == 0 {
		ls, err := w.Claim(ctx, "queue", 1)
		require.NoError(t, err)
		require.Len(t, ls, 1, "queue ran dry before the killed worker's item came back")
		if ls[0].Name() == victim {
			back = time.Since(killed)
		} else {
			before++
		}
		time.Sleep(150 * time.Millisecond) // the item's work
		require.NoError(t, ls[0].Complete(ctx))
	}
	t.Logf("killed worker's item retried after %s and %d other items (TTL %s)", back.Round(time.Millisecond), before, ttl)
	assert.Less(t, before, len(names)/2, "the items never claimed went before the killed worker's")
}

// Items come out in the order they were registered, also after release.
func TestClaimOrder(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 30*time.Second)
	c := newClient(t, pool, leasetable.Config{Owner: "c"})
	_, err := c.Register(ctx, "q", "z", "y", "x")
	require.NoError(t, err)
	_, err = c.Register(ctx, "q", "a")
	require.NoError(t, err)
	first, err := c.Claim(ctx, "q", 2)
	require.NoError(t, err)
	require.Len(t, first, 2)
	assert.Equal(t, "z", first[0].Name())
	assert.Equal(t, "y", first[1].Name())
	require.NoError(t, first[1].Release(ctx))
	rest, err := c.Claim(ctx, "q", 3)
	require.NoError(t, err)
	got := []string{}
	for _, l := range rest {
		got = append(got, l.Name())
	}
	assert.Equal(t, []string{"y", "x", "a"}, got)
}

// A Complete that could not reach the server keeps its result when Close
// later gives the item back: the item was released, not completed, and a
// repeated Complete still says so instead of returning nil.
func TestCloseKeepsTheResultOfAFailedComplete(t *testing.T) {
	d := env.DB(t)
	direct := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	pool, proxy := env.ProxiedPool(t, d)
	c, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "c", TTL: time.Minute, ReleaseTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	_, err = c.Register(ctx, "items", "a")
	require.NoError(t, err)
	items, err := c.Claim(ctx, "items", 1)
	require.NoError(t, err)
	require.Len(t, items, 1)

	proxy.Stall()
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	first := items[0].Complete(short)
	require.Error(t, first, "the server is unreachable")
	proxy.Cut()
	proxy.Resume()
	require.NoError(t, c.Close(ctx))
	assert.Empty(t, heldBy(t, direct, "c"), "Close gave the item back")
	assert.Equal(t, 1, pgtest.Count(t, direct, "SELECT count(*) FROM pgbaton.lease WHERE name = 'a'"), "released, not completed")
	again := items[0].Complete(ctx)
	require.Error(t, again, "the item was not completed")
	assert.Equal(t, first.Error(), again.Error(), "Complete returns its first result")
}
