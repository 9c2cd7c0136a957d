package leasetable_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
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

func TestDoCancelsOnLossAndReleasesOnEveryPath(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{TTL: 600 * time.Millisecond})
	held := func() bool {
		in, err := c.Info(ctx, "do")
		require.NoError(t, err)
		return in.Held
	}

	require.NoError(t, c.Do(ctx, "do", func(ctx context.Context) error {
		assert.True(t, held())
		return nil
	}))
	assert.False(t, held())

	boom := errors.New("boom")
	require.ErrorIs(t, c.Do(ctx, "do", func(context.Context) error { return boom }), boom)
	assert.False(t, held())

	require.Panics(t, func() {
		_ = c.Do(ctx, "do", func(context.Context) error { panic("fn panicked") })
	})
	assert.False(t, held(), "released even when fn panics")

	// Loss: an operator force-releases the grant under fn and somebody
	// else takes it; fn's context ends with ErrLeaseLost at the next
	// keep-alive.
	thief := newClient(t, pool, leasetable.Config{Owner: "thief"})
	err := c.Do(ctx, "do", func(fnCtx context.Context) error {
		_, err := pool.Exec(ctx, "SELECT pgbaton.force_release_lease('do', 'test')")
		require.NoError(t, err)
		_, err = thief.TryAcquire(ctx, "do")
		require.NoError(t, err)
		<-fnCtx.Done()
		return nil
	})
	require.ErrorIs(t, err, leasetable.ErrLeaseLost)
	in, err := c.Info(ctx, "do")
	require.NoError(t, err)
	assert.Equal(t, "thief", in.Owner, "a lost Do leaves the new holder alone")
	require.NoError(t, thief.Close(ctx))

	// Caller's context ends: fn sees it, lease released, no ErrLeaseLost.
	cctx, cancel := context.WithCancel(ctx)
	_, err = pool.Exec(ctx, "DELETE FROM pgbaton.lease WHERE name = 'do'")
	require.NoError(t, err)
	err = c.Do(cctx, "do", func(fnCtx context.Context) error {
		cancel()
		<-fnCtx.Done()
		return fnCtx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	assert.False(t, held())
}

// When the lease is lost while fn runs and fn fails too, Do returns both:
// the loss is never dropped for fn's error (advisory.RunExclusive does the
// same). The loss is seen either by fn, through its context, or only by
// the release afterwards.
func TestDoJoinsWorkErrorWithLoss(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{TTL: 600 * time.Millisecond})
	boom := errors.New("boom")
	takeOver := func(name string) {
		t.Helper()
		_, err := pool.Exec(ctx, "SELECT pgbaton.force_release_lease($1, 'test')", name)
		require.NoError(t, err)
		thief := newClient(t, pool, leasetable.Config{Owner: "thief"})
		_, err = thief.TryAcquire(ctx, name)
		require.NoError(t, err)
	}

	// fn sees the loss and fails.
	err := c.Do(ctx, "do-seen", func(fnCtx context.Context) error {
		takeOver("do-seen")
		<-fnCtx.Done()
		return errors.Join(boom, context.Cause(fnCtx))
	})
	require.ErrorIs(t, err, boom)
	require.ErrorIs(t, err, leasetable.ErrLeaseLost)

	// fn fails before the client notices; the release finds the grant
	// taken over.
	err = c.Do(ctx, "do-unseen", func(context.Context) error {
		takeOver("do-unseen")
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.ErrorIs(t, err, leasetable.ErrLeaseLost, "the loss found at release is returned with fn's error")
	in, err := c.Info(ctx, "do-unseen")
	require.NoError(t, err)
	assert.Equal(t, "thief", in.Owner, "a lost Do leaves the new holder alone")
}

func TestElection(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: time.Minute})
	b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: time.Minute})
	_, err := a.Leader(ctx, "leader")
	require.ErrorIs(t, err, leasetable.ErrNoLeader)

	la, err := a.Elect(ctx, "leader", "10.0.0.1:80")
	require.NoError(t, err)
	ld, err := b.Leader(ctx, "leader")
	require.NoError(t, err)
	assert.Equal(t, leasetable.Leader{Owner: "a", Value: "10.0.0.1:80", Term: la.Term(), Remaining: ld.Remaining}, ld)
	assert.Greater(t, ld.Remaining, 50*time.Second)

	won := make(chan *leasetable.Leadership)
	go func() {
		lb, err := b.Elect(ctx, "leader", "10.0.0.2:80")
		assert.NoError(t, err)
		won <- lb
	}()
	select {
	case <-won:
		t.Fatal("two leaders")
	case <-time.After(50 * time.Millisecond): // b keeps waiting while a leads
	}
	require.NoError(t, la.Resign(ctx))
	lb := <-won
	assert.Greater(t, lb.Term(), la.Term())
	ld, err = a.Leader(ctx, "leader")
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2:80", ld.Value)
	assert.Equal(t, lb.Term(), ld.Term)
	require.NoError(t, lb.Resign(ctx))
}

func TestCampaignTermsNeverOverlap(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx, cancel := context.WithCancel(pgtest.Context(t, time.Minute))
	defer cancel()
	var leaders atomic.Int32
	var mu sync.Mutex
	var terms []int64
	var wg sync.WaitGroup
	for i := range 3 {
		c := newClient(t, pool, leasetable.Config{Owner: "c" + strconv.Itoa(i), TTL: time.Minute})
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.Campaign(ctx, "campaign", "", leasetable.Callbacks{
				OnStartedLeading: func(ctx context.Context, term int64) {
					if n := leaders.Add(1); n != 1 {
						t.Errorf("%d leaders at once", n)
					}
					mu.Lock()
					terms = append(terms, term)
					done := len(terms) >= 9
					mu.Unlock()
					leaders.Add(-1)
					if done {
						cancel()
					}
				},
			})
			assert.ErrorIs(t, err, context.Canceled)
		}()
	}
	wg.Wait()
	require.GreaterOrEqual(t, len(terms), 9)
	for i := 1; i < len(terms); i++ {
		assert.Greater(t, terms[i], terms[i-1])
	}
}

func TestSemaphoreNeverExceedsSlots(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	const slots, workers, rounds = 3, 8, 10
	var inside, peak atomic.Int32
	var wg sync.WaitGroup
	for w := range workers {
		c := newClient(t, pool, leasetable.Config{Owner: "s" + strconv.Itoa(w), TTL: time.Minute})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				l, err := c.Semaphore(ctx, "pool", slots)
				if !assert.NoError(t, err) {
					return
				}
				n := inside.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				// Hold the permit across a round trip so holders overlap.
				_, err = pool.Exec(ctx, "SELECT pg_sleep(0.003)")
				assert.NoError(t, err)
				inside.Add(-1)
				assert.NoError(t, l.Release(ctx))
			}
		}()
	}
	wg.Wait()
	t.Logf("peak concurrent permits: %d of %d", peak.Load(), slots)
	assert.LessOrEqual(t, peak.Load(), int32(slots))
	assert.Equal(t, int32(slots), peak.Load(), "the permits were used in parallel")
}

func TestWaitersSurviveListenConnectionLoss(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	holder := newClient(t, pool, leasetable.Config{Owner: "h", TTL: time.Minute})
	waiting := make(chan string, 1)
	waiter := newClient(t, pool, leasetable.Config{Owner: "w", TTL: time.Minute, Logger: logTo(waiting)})
	l, err := holder.TryAcquire(ctx, "x")
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		wl, err := waiter.Acquire(ctx, "x")
		if err == nil {
			err = wl.Release(ctx)
		}
		got <- err
	}()
	require.Equal(t, "x", <-waiting)
	// Kill the waiter's LISTEN backend; the release then happens while it
	// may be reconnecting. The waiter must still get the lease long before
	// the minute-long TTL.
	var pid uint32
	require.NoError(t, pool.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'pgbaton lease listener %' AND pid <> pg_backend_pid() AND datname = current_database()").Scan(&pid))
	env.Terminate(t, pid)
	require.NoError(t, l.Release(ctx))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("waiter not woken after its LISTEN connection was killed")
	}
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgbaton lease listener %' AND pid <> pg_backend_pid() AND datname = current_database()").Scan(&n)
		return n == 1, err
	}, "listener did not reconnect")
}

func TestClaimCompleteWorkItems(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: time.Minute})
	b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: time.Minute})
	items := make([]string, 50)
	for i := range items {
		items[i] = "item-" + strconv.Itoa(i)
	}
	_, err := a.Register(ctx, "queue", items...)
	require.NoError(t, err)
	la, err := a.Claim(ctx, "queue", 30)
	require.NoError(t, err)
	lb, err := b.Claim(ctx, "queue", 30)
	require.NoError(t, err)
	assert.Len(t, la, 30)
	assert.Len(t, lb, 20, "only what is left")
	// One of a's items is taken over behind its back; completing the batch
	// deletes the rest and leaves that one to its new holder.
	_, err = pool.Exec(ctx, "UPDATE pgbaton.lease SET owner = 'thief', token = nextval('pgbaton.lease_token_seq') WHERE name = $1", la[3].Name())
	require.NoError(t, err)
	err = a.Complete(ctx, la...)
	require.ErrorIs(t, err, leasetable.ErrNotHeld)
	assert.Contains(t, err.Error(), la[3].Name())
	require.ErrorIs(t, la[3].Release(ctx), leasetable.ErrNotHeld, "Release after Complete returns Complete's result")
	require.NoError(t, b.Complete(ctx, lb...))
	require.NoError(t, b.Complete(ctx, lb...), "completing twice does nothing")
	var left []string
	rows, err := pool.Query(ctx, "SELECT name FROM pgbaton.lease WHERE lease_group = 'queue'")
	require.NoError(t, err)
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		left = append(left, n)
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []string{la[3].Name()}, left)
	for _, l := range append(la, lb...) {
		assert.ErrorIs(t, l.Err(), leasetable.ErrReleased)
	}
}

func TestCompleteAndClaim(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: time.Minute})
	b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: time.Minute})
	items := make([]string, 10)
	for i := range items {
		items[i] = "item-" + strconv.Itoa(i)
	}
	_, err := a.Register(ctx, "queue", items...)
	require.NoError(t, err)
	count := func(where string) int {
		t.Helper()
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease WHERE lease_group = 'queue' AND "+where).Scan(&n))
		return n
	}

	la, err := a.Claim(ctx, "queue", 3)
	require.NoError(t, err)
	lb, err := b.Claim(ctx, "queue", 1)
	require.NoError(t, err)
	// Bad input changes nothing: no lease ends, nothing is claimed.
	_, err = a.CompleteAndClaim(ctx, "queue", 0, la...)
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	_, err = a.CompleteAndClaim(ctx, "", 1, la...)
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	_, err = a.CompleteAndClaim(ctx, "queue", 1, la[0], lb[0])
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	_, err = a.CompleteAndClaim(ctx, "queue", 1, nil)
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	for _, l := range append(la, lb...) {
		require.NoError(t, l.Err())
	}
	assert.Equal(t, 4, count("owner IS NOT NULL"))

	// One of a's items is taken over behind its back: the others are
	// completed, the claim happens all the same, and the error says which.
	_, err = pool.Exec(ctx, "UPDATE pgbaton.lease SET owner = 'thief', token = nextval('pgbaton.lease_token_seq') WHERE name = $1", la[1].Name())
	require.NoError(t, err)
	next, err := a.CompleteAndClaim(ctx, "queue", 4, la...)
	require.ErrorIs(t, err, leasetable.ErrNotHeld)
	assert.Contains(t, err.Error(), la[1].Name())
	require.Len(t, next, 4)
	for _, l := range la {
		assert.ErrorIs(t, l.Err(), leasetable.ErrReleased)
		for _, n := range next {
			assert.NotEqual(t, l.Name(), n.Name())
			assert.Greater(t, n.Token(), l.Token())
		}
	}
	assert.Equal(t, 8, count("true"), "two completed")
	assert.Equal(t, 4, count("owner = 'a'"))

	// A worker's loop drains the rest; the last call claims nothing.
	completed := 2
	for len(next) > 0 {
		done := len(next)
		next, err = a.CompleteAndClaim(ctx, "queue", 4, next...)
		require.NoError(t, err)
		completed += done
	}
	require.NoError(t, b.Complete(ctx, lb...))
	assert.Equal(t, 8, completed, "every item but the stolen one and b's")
	assert.Equal(t, 1, count("true"), "only the stolen item is left")

	// A round trip that fails does neither: the leases stay uncompleted.
	_, err = a.Register(ctx, "queue", "late-0", "late-1")
	require.NoError(t, err)
	late, err := a.Claim(ctx, "queue", 1)
	require.NoError(t, err)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = a.CompleteAndClaim(cctx, "queue", 1, late...)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 3, count("true"), "nothing deleted")
	// The uncompleted lease may be given back already (in the background).
	assert.Zero(t, count("owner = 'a' AND name <> '"+late[0].Name()+"'"), "nothing claimed")

	// A claim the server refuses after the completion ran undoes the
	// completion: one transaction.
	_, err = pool.Exec(ctx, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'refused'; END $$;
		CREATE TRIGGER refuse BEFORE UPDATE ON pgbaton.lease FOR EACH ROW
		WHEN (NEW.lease_group = 'refused') EXECUTE FUNCTION refuse()`)
	require.NoError(t, err)
	_, err = a.Register(ctx, "refused", "r-0")
	require.NoError(t, err)
	_, err = a.Register(ctx, "queue", "late-2")
	require.NoError(t, err)
	late, err = a.Claim(ctx, "queue", 1)
	require.NoError(t, err)
	_, failed := a.CompleteAndClaim(ctx, "refused", 1, late...)
	require.ErrorContains(t, failed, "refused")
	var kept int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease WHERE name = $1 AND token = $2",
		late[0].Name(), late[0].Token()).Scan(&kept))
	assert.Equal(t, 1, kept, "the completion was rolled back with the claim")
	assert.ErrorIs(t, late[0].Release(ctx), failed, "Release after a failed completion returns its error")
}

// childKeeper keeps up to args[2] leases of group args[1] and prints
// "kept NAME" for each, until killed.
func childKeeper(ctx context.Context, args []string) error {
	n, _ := strconv.Atoi(args[2])
	c, closeFn, err := childClient(ctx, args[0], shortTTL)
	if err != nil {
		return err
	}
	defer closeFn()
	return c.Keep(ctx, leasetable.KeepConfig{Group: args[1], Max: n, Work: func(ctx context.Context, l *leasetable.Lease) {
		pgtest.Printf("kept %s", l.Name())
		<-ctx.Done()
	}})
}

func TestKeepTakesOverDeadWorkersShards(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "survivor", TTL: shortTTL})
	shards := make([]string, 8)
	for i := range shards {
		shards[i] = "shard-" + strconv.Itoa(i)
	}
	_, err := c.Register(ctx, "keep", shards...)
	require.NoError(t, err)

	k := env.StartChild(t, "keeper", d.URL, "keep", "4")
	childs := map[string]bool{}
	for range 4 {
		childs[k.Expect(t, "kept", 30*time.Second)] = true
	}
	var mu sync.Mutex
	mine := map[string]bool{}
	kept := make(chan string, 16)
	kctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Keep(kctx, leasetable.KeepConfig{Group: "keep", Max: 8, Work: func(ctx context.Context, l *leasetable.Lease) {
			mu.Lock()
			mine[l.Name()] = true
			mu.Unlock()
			kept <- l.Name()
			<-ctx.Done()
		}})
	}()
	for range 4 {
		n := <-kept
		assert.False(t, childs[n], "%s kept by both", n)
	}
	killed := time.Now()
	k.Signal(t, syscall.SIGKILL)
	for range 4 {
		n := <-kept
		assert.True(t, childs[n], "%s was not the dead worker's", n)
	}
	t.Logf("dead worker's shards taken over %s after SIGKILL (TTL %s)", time.Since(killed), shortTTL)
	mu.Lock()
	assert.Len(t, mine, 8)
	mu.Unlock()
	stop()
	require.ErrorIs(t, <-done, context.Canceled)
	var held int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease WHERE lease_group = 'keep' AND owner IS NOT NULL").Scan(&held))
	assert.Zero(t, held, "Keep released everything when its context ended")
}

// A wait whose group is held only by the waiter's own client (a Semaphore
// whose permits it holds, a Keep with Max above the group's size) has no
// expiry of somebody else's to wait for: it waits for a release, looking
// again at most every TTL, as ClaimWait does. It used to look again after
// the jitter alone (1-21 ms), sending two statements each time for as
// long as it waited.
func TestWaitOnOwnGroupDoesNotSpin(t *testing.T) {
	d := env.DB(t)
	sent := &statementCounter{}
	pool := d.Pool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = sent })
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "own", TTL: time.Minute})
	const window = time.Second
	const most = 20 // a few looks and registrations; a spin sends ~100 a second

	t.Run("semaphore", func(t *testing.T) {
		l, err := c.Semaphore(ctx, "own-sem", 1)
		require.NoError(t, err)
		before := len(sent.snapshot())
		wctx, cancel := context.WithTimeout(ctx, window)
		defer cancel()
		_, err = c.Semaphore(wctx, "own-sem", 1)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		n := len(sent.snapshot()) - before
		t.Logf("statements sent by a Semaphore waiting %s behind its own client: %d", window, n)
		assert.LessOrEqual(t, n, most)
		require.NoError(t, l.Release(ctx))
	})
	t.Run("keep", func(t *testing.T) {
		_, err := c.Register(ctx, "own-keep", "a", "b")
		require.NoError(t, err)
		kept, done, cancel := startKeep(ctx, c, "own-keep", 3)
		defer cancel()
		<-kept
		<-kept
		before := len(sent.snapshot())
		stop := time.AfterFunc(window, cancel)
		defer stop.Stop()
		require.ErrorIs(t, <-done, context.Canceled)
		n := len(sent.snapshot()) - before
		t.Logf("statements sent by a Keep holding the whole group for %s: %d", window, n)
		// Its two leases' releases when it ends, besides the looks.
		assert.LessOrEqual(t, n, most)
	})
}

// With NoListen a Keep short of Max polls every PollInterval, as
// ClaimWait does: a shard registered later is kept soon, not at the next
// TTL (nothing notifies a client that does not listen).
func TestKeepNoListenPolls(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "keep-poller", TTL: neverPoll, NoListen: true, PollInterval: 100 * time.Millisecond})
	_, err := c.Register(ctx, "keep-poll", "a")
	require.NoError(t, err)
	kept, done, cancel := startKeep(ctx, c, "keep-poll", 2)
	defer cancel()
	require.Equal(t, "a", <-kept)
	_, err = c.Register(ctx, "keep-poll", "b")
	require.NoError(t, err)
	select {
	case n := <-kept:
		require.Equal(t, "b", n)
	case <-time.After(10 * time.Second):
		t.Fatal("a polling Keep did not take a shard registered later within 10s (PollInterval 100ms)")
	}
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

// startKeep runs c.Keep on group with Max limit on a goroutine of its own: each
// lease kept is sent on kept and held until Keep's context ends (cancel);
// Keep's result comes on done.
func startKeep(ctx context.Context, c *leasetable.Client, group string, limit int) (kept <-chan string, done <-chan error, cancel func()) {
	kctx, cancel := context.WithCancel(ctx)
	names := make(chan string, limit)
	result := make(chan error, 1)
	go func() {
		result <- c.Keep(kctx, leasetable.KeepConfig{Group: group, Max: limit, Work: func(ctx context.Context, l *leasetable.Lease) {
			names <- l.Name()
			<-ctx.Done()
		}})
	}()
	return names, result, cancel
}
