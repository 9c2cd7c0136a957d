package leasetable_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/pgbatontest"
)

// receive is the next leader an observer is sent, within a minute.
func receive(t *testing.T, ch <-chan leasetable.Leader) leasetable.Leader {
	t.Helper()
	select {
	case ld, ok := <-ch:
		require.True(t, ok, "the observer's channel closed")
		return ld
	case <-time.After(time.Minute):
		t.Fatal("no leader observed within a minute")
		return leasetable.Leader{}
	}
}

func TestObserveSendsEveryTermInOrder(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, 2*time.Minute)
	watcher := newClient(t, pool, leasetable.Config{Owner: "watcher"})
	octx, stop := context.WithCancel(ctx)
	ch, err := watcher.Observe(octx, "observed")
	require.NoError(t, err)

	candidates := []*leasetable.Client{
		newClient(t, pool, leasetable.Config{Owner: "a"}),
		newClient(t, pool, leasetable.Config{Owner: "b"}),
	}
	var lat []time.Duration
	var last int64
	for i := range 20 {
		c := candidates[i%2]
		// The election is free: Elect is the grant, and the observer is
		// woken when it commits.
		start := time.Now()
		ld, err := c.Elect(ctx, "observed", fmt.Sprint("addr-", i))
		require.NoError(t, err)
		got := receive(t, ch)
		lat = append(lat, time.Since(start))
		assert.Equal(t, ld.Term(), got.Term, "the term just begun, not an older one")
		assert.Equal(t, fmt.Sprint("addr-", i), got.Value)
		assert.Equal(t, []string{"a", "b"}[i%2], got.Owner)
		assert.Greater(t, got.Term, last)
		last = got.Term
		require.NoError(t, ld.Resign(ctx))
	}
	t.Logf("observe latency, Elect sent to leader received: p50 %s, max %s", percentile(lat, 50), percentile(lat, 100))
	stop()
	for range ch { // closed once its context ends
	}
}

func TestObserveStartsWithTheCurrentLeaderAndSkipsNothingNewer(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "a"})
	ld, err := c.Elect(ctx, "current", "x")
	require.NoError(t, err)
	watcher := newClient(t, pool, leasetable.Config{Owner: "watcher", NoListen: true, PollInterval: 50 * time.Millisecond})
	ch, err := watcher.Observe(ctx, "current")
	require.NoError(t, err)
	assert.Equal(t, ld.Term(), receive(t, ch).Term, "a polling observer too")
	require.NoError(t, ld.Resign(ctx))
	ld2, err := c.Elect(ctx, "current", "y")
	require.NoError(t, err)
	assert.Equal(t, ld2.Term(), receive(t, ch).Term)

	_, err = watcher.Observe(ctx, "")
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
}

// campaigner is one replica campaigning in the background; its terms are
// recorded in terms.
type campaigner struct {
	owner   string
	stop    context.CancelFunc
	done    chan struct{}
	started chan int64 // each term, as it begins
}

type termLog struct {
	mu      sync.Mutex
	leading atomic.Int32
	terms   []termRecord
	overlap atomic.Bool
}

type termRecord struct {
	owner string
	term  int64
	cause error // why the term's context ended
}

func (tl *termLog) campaign(t *testing.T, ctx context.Context, c *leasetable.Client, owner string, opts ...leasetable.CampaignOption) *campaigner {
	cctx, stop := context.WithCancel(ctx)
	cp := &campaigner{owner: owner, stop: stop, done: make(chan struct{}), started: make(chan int64, 100)}
	go func() {
		defer close(cp.done)
		err := c.CampaignWith(cctx, "leader", owner, leasetable.Callbacks{
			OnStartedLeading: func(ctx context.Context, term int64) {
				if tl.leading.Add(1) != 1 {
					tl.overlap.Store(true)
				}
				cp.started <- term
				<-ctx.Done()
				tl.mu.Lock()
				tl.terms = append(tl.terms, termRecord{owner, term, context.Cause(ctx)})
				tl.mu.Unlock()
				tl.leading.Add(-1)
			},
		}, opts...)
		assert.ErrorIs(t, err, context.Canceled)
	}()
	return cp
}

func (cp *campaigner) quit() {
	cp.stop()
	<-cp.done
}

// leaderIs waits until the election's leader is owned by one of owners
// and returns it.
func leaderIs(t *testing.T, ctx context.Context, c *leasetable.Client, owners ...string) leasetable.Leader {
	t.Helper()
	var ld leasetable.Leader
	pgtest.Eventually(t, time.Minute, func() (bool, error) {
		var err error
		ld, err = c.Leader(ctx, "leader")
		if errors.Is(err, leasetable.ErrNoLeader) {
			return false, nil
		}
		for _, o := range owners {
			if err == nil && ld.Owner == o {
				return true, nil
			}
		}
		return false, err
	}, "leader one of %v", owners)
	return ld
}

func TestRequestResignHandsOverWithinOneWakeUp(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, 2*time.Minute)
	var tl termLog
	var cps []*campaigner
	clients := map[string]*leasetable.Client{}
	for _, o := range []string{"r0", "r1", "r2"} {
		clients[o] = newClient(t, pool, leasetable.Config{Owner: o, TTL: 10 * time.Second})
		cps = append(cps, tl.campaign(t, ctx, clients[o], o))
	}
	operator := newClient(t, pool, leasetable.Config{Owner: "operator"})
	var handOver []time.Duration
	for range 10 {
		before := leaderIs(t, ctx, operator, "r0", "r1", "r2")
		start := time.Now()
		term, err := operator.RequestResign(ctx, "leader", "test hand-over")
		require.NoError(t, err)
		require.Equal(t, before.Term, term)
		// The next term begins on another replica: every candidate's
		// started channel is read until a term larger than the old one.
		next := func() int64 {
			for {
				for _, cp := range cps {
					select {
					case tm := <-cp.started:
						if tm > term {
							return tm
						}
					default:
					}
				}
				select {
				case <-ctx.Done():
					t.Fatal("no new term")
				case <-time.After(time.Millisecond):
				}
			}
		}()
		handOver = append(handOver, time.Since(start))
		assert.Greater(t, next, term)
	}
	t.Logf("hand-over after RequestResign (request sent to new term begun): p50 %s, max %s", percentile(handOver, 50), percentile(handOver, 100))
	assert.Less(t, percentile(handOver, 50), 5*time.Second, "within a wake-up, not a TTL")
	for _, cp := range cps {
		cp.quit()
	}
	assert.False(t, tl.overlap.Load(), "two terms at once")
	asked := 0
	for _, r := range tl.terms {
		if errors.Is(r.cause, leasetable.ErrResignRequested) {
			asked++
			assert.ErrorContains(t, r.cause, "test hand-over")
		}
	}
	assert.Equal(t, 10, asked, "each asked term ended with ErrResignRequested")

	// A candidate that quit while its grant was in flight gives that
	// grant back in the background (Campaign returns when ctx ends), so
	// the row is freed soon after quit, not at once: well within the TTL.
	pgtest.Eventually(t, 5*time.Second, func() (bool, error) {
		_, err := operator.Leader(ctx, "leader")
		return errors.Is(err, leasetable.ErrNoLeader), nil
	}, "no leader once every candidate quit, before the 10 s TTL")
	// Not "leader" again: a grant that was still on its way when the
	// read above found none may have landed since, and stays until the
	// give-back after it.
	_, err := operator.RequestResign(ctx, "never-led", "nobody leads")
	assert.ErrorIs(t, err, leasetable.ErrNoLeader)
	_, err = operator.RequestResign(ctx, "leader", "")
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
}

func TestElectSeesResignRequested(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "a"})
	ld, err := c.Elect(ctx, "leader", "x")
	require.NoError(t, err)
	require.NoError(t, ld.ResignReason())
	require.NoError(t, ld.Check(0), "leading, keep-alives on time")
	_, err = c.RequestResign(ctx, "leader", "maintenance")
	require.NoError(t, err)
	select {
	case <-ld.ResignRequested():
	case <-ctx.Done():
		t.Fatal("the leader never saw the request")
	}
	assert.ErrorIs(t, ld.ResignReason(), leasetable.ErrResignRequested)
	assert.ErrorContains(t, ld.ResignReason(), "maintenance")
	assert.NoError(t, ld.Err(), "still leading until it resigns")
	require.NoError(t, ld.Resign(ctx))
	assert.Error(t, ld.Check(time.Hour), "not leading any more")
	assert.ErrorIs(t, ld.Check(-1), pgbaton.ErrInvalidArgument)
	_, err = c.ElectWith(ctx, "leader", "x", leasetable.Ineligible())
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
}

func TestIneligibleNeverLeads(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	var tl termLog
	observer := newClient(t, pool, leasetable.Config{Owner: "observer"})
	ineligible := tl.campaign(t, ctx, newClient(t, pool, leasetable.Config{Owner: "ineligible"}), "ineligible", leasetable.Ineligible())
	eligible := tl.campaign(t, ctx, newClient(t, pool, leasetable.Config{Owner: "eligible"}), "eligible")
	// Each term is counted when its OnStartedLeading runs, not when the
	// lease row shows it: a term granted just as the campaign ends is given
	// back without a callback (Campaign's contract), so a term seen only in
	// the table need not reach the log.
	started := func() int64 {
		select {
		case term := <-eligible.started:
			return term
		case <-ctx.Done():
			t.Fatal("no term started")
			return 0
		}
	}
	term := started()
	for range 5 {
		asked, err := observer.RequestResign(ctx, "leader", "let someone else lead")
		require.NoError(t, err)
		require.Equal(t, term, asked)
		// The eligible candidate leads again: it is the only one.
		next := started()
		require.Greater(t, next, term)
		term = next
	}
	eligible.quit()
	pgtest.Eventually(t, time.Minute, func() (bool, error) {
		_, err := observer.Leader(ctx, "leader")
		return errors.Is(err, leasetable.ErrNoLeader), nil
	}, "nobody leads with only the ineligible candidate left")
	ineligible.quit()
	for _, r := range tl.terms {
		assert.Equal(t, "eligible", r.owner)
	}
	assert.Len(t, tl.terms, 6)
}

func TestPreferredCandidateGetsTheNextTerm(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	old := newClient(t, pool, leasetable.Config{Owner: "old"})
	ld, err := old.Elect(ctx, "leader", "v1")
	require.NoError(t, err)
	// An older candidate of the same rank queues first...
	older := newClient(t, pool, leasetable.Config{Owner: "older"})
	olderWon := make(chan *leasetable.Leadership, 1)
	go func() {
		l, err := older.Elect(ctx, "leader", "v1")
		assert.NoError(t, err)
		olderWon <- l
	}()
	pgtest.Eventually(t, time.Minute, func() (bool, error) {
		return pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_queue WHERE name = 'leader'") == 1, nil
	}, "the older candidate queued")
	// ...then a preferred one: the leader is asked to yield, and the term
	// goes to the preferred candidate, ahead of the older one.
	preferred := newClient(t, pool, leasetable.Config{Owner: "preferred"})
	won := make(chan *leasetable.Leadership, 1)
	go func() {
		l, err := preferred.ElectWith(ctx, "leader", "v2", leasetable.Preference(1))
		assert.NoError(t, err)
		won <- l
	}()
	select {
	case <-ld.ResignRequested():
	case <-ctx.Done():
		t.Fatal("the leader was not asked to yield to the preferred candidate")
	}
	assert.ErrorContains(t, ld.ResignReason(), "rank 1")
	assert.Equal(t, 2, pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_queue WHERE name = 'leader'"))
	assert.Equal(t, 1, pgtest.Count(t, pool, "SELECT position::int FROM pgbaton.lease_queue WHERE name = 'leader' AND owner = 'preferred'"))
	require.NoError(t, ld.Resign(ctx))
	var p *leasetable.Leadership
	select {
	case p = <-won:
	case <-olderWon:
		t.Fatal("the older candidate of a lower rank was elected first")
	case <-ctx.Done():
		t.Fatal("nobody elected")
	}
	require.NotNil(t, p)
	assert.Greater(t, p.Term(), ld.Term())
	select {
	case <-p.ResignRequested():
		t.Fatal("a candidate of a lower rank asked the preferred leader to yield")
	default:
	}
	require.NoError(t, p.Resign(ctx))
	require.NoError(t, (<-olderWon).Resign(ctx))
}

// A rolling upgrade: five replicas of version 1 restart one by one as
// version 2, whose candidates rank higher. From the first term a version-2
// replica holds, every term is held by version 2, also when the operator
// asks the leader to resign in between; no two terms overlap; terms grow.
func TestRollingRestartKeepsThePreferredVersionLeading(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, 3*time.Minute)
	var tl termLog
	operator := newClient(t, pool, leasetable.Config{Owner: "operator"})
	cfg := func(o string) leasetable.Config { return leasetable.Config{Owner: o, TTL: 10 * time.Second} }
	replicas := make([]*campaigner, 5)
	for i := range replicas {
		o := fmt.Sprintf("v1-%d", i)
		replicas[i] = tl.campaign(t, ctx, newClient(t, pool, cfg(o)), o)
	}
	leaderIs(t, ctx, operator, "v1-0", "v1-1", "v1-2", "v1-3", "v1-4")
	// Restart the followers first and the leader last, as an operator
	// would not: the leader's own restart is when a version-1 replica
	// could win.
	var v2 []string
	var takeOver []time.Duration
	for i := range replicas {
		replicas[i].quit()
		o := fmt.Sprintf("v2-%d", i)
		v2 = append(v2, o)
		start := time.Now()
		replicas[i] = tl.campaign(t, ctx, newClient(t, pool, cfg(o)), o, leasetable.Preference(2))
		leaderIs(t, ctx, operator, v2...)
		if i == 0 {
			takeOver = append(takeOver, time.Since(start))
		}
		if i == 0 {
			continue // asked to resign, the only version-2 replica would hand over to version 1
		}
		pgtest.Eventually(t, time.Minute, func() (bool, error) {
			return pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_queue WHERE name = 'leader' AND owner = $1", o) == 1, nil
		}, "%s queued", o)
		// The operator asks the leader to resign: another version-2
		// replica takes over, ahead of the version-1 ones queued before.
		before, err := operator.Leader(ctx, "leader")
		require.NoError(t, err)
		_, err = operator.RequestResign(ctx, "leader", "rolling restart")
		require.NoError(t, err)
		pgtest.Eventually(t, time.Minute, func() (bool, error) {
			now, err := operator.Leader(ctx, "leader")
			return err == nil && now.Term > before.Term, nil
		}, "a new term after the request")
		leaderIs(t, ctx, operator, v2...)
	}
	for _, cp := range replicas {
		cp.quit()
	}
	t.Logf("first version-2 replica leading after its start: %s", takeOver[0])
	assert.False(t, tl.overlap.Load(), "two terms at once")
	var last int64
	firstV2 := -1
	for i, r := range tl.terms {
		assert.Greater(t, r.term, last, "terms grow")
		last = r.term
		if firstV2 < 0 && r.owner[:2] == "v2" {
			firstV2 = i
		}
		if firstV2 >= 0 {
			assert.Equal(t, "v2", r.owner[:2], "term %d by %s after the first version-2 term", r.term, r.owner)
		}
	}
	require.GreaterOrEqual(t, firstV2, 0)
}

// Other languages observe with SQL alone: docs/leader-election.md's
// recipe.
func TestObserveFromSQL(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	conn := listenConn(t, ctx, pool)
	_, err := conn.Exec(ctx, `SELECT pgbaton.wait_for('scheduler', 'dashboard/1', false, NULL, 60000, true, NULL)`)
	require.NoError(t, err)
	c := newClient(t, pool, leasetable.Config{Owner: "replica-a"})
	ld, err := c.Elect(ctx, "scheduler", "10.0.0.7:8080")
	require.NoError(t, err)
	for { // the client's own LISTEN checks use the channel too
		n, err := conn.WaitForNotification(ctx)
		require.NoError(t, err)
		if n.Payload == "dashboard/1" {
			break
		}
	}
	var owner, value string
	var term int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT owner, value, term FROM pgbaton.leader WHERE name = 'scheduler'`).Scan(&owner, &value, &term))
	assert.Equal(t, []any{"replica-a", "10.0.0.7:8080", ld.Term()}, []any{owner, value, term})
	assert.Zero(t, pgtest.Count(t, pool, `SELECT count(*) FROM pgbaton.lease_queue`), "observers do not queue")
	_, err = conn.Exec(ctx, `SELECT pgbaton.stop_waiting('scheduler', 'dashboard/1')`)
	require.NoError(t, err)
}

// A leader whose client does not listen hears a request at its poll.
func TestPollingLeaderSeesResignRequested(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, pool, leasetable.Config{Owner: "a", NoListen: true, PollInterval: 100 * time.Millisecond})
	ld, err := c.Elect(ctx, "leader", "x")
	require.NoError(t, err)
	_, err = newClient(t, pool, leasetable.Config{Owner: "operator"}).RequestResign(ctx, "leader", "polling")
	require.NoError(t, err)
	select {
	case <-ld.ResignRequested():
	case <-ctx.Done():
		t.Fatal("a polling leader never saw the request")
	}
	require.NoError(t, ld.Resign(ctx))
}

// Check turns degraded while keep-alives are late, before leadership is
// lost.
func TestLeadershipCheckDegradesWhileKeepAlivesAreLate(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	d := env.DB(t)
	pool, proxy := env.ProxiedPool(t, d)
	c := newClient(t, pool, leasetable.Config{Owner: "a", TTL: 3 * time.Second})
	ld, err := c.Elect(ctx, "leader", "x")
	require.NoError(t, err)
	require.NoError(t, ld.Check(0))
	proxy.Stall()
	var degraded error
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		degraded = ld.Check(200 * time.Millisecond)
		return degraded != nil, nil
	}, "Check reports late keep-alives")
	lost := ld.Err()
	proxy.Resume()
	require.NoError(t, lost, "degraded before the local deadline: %v", degraded)
	assert.ErrorIs(t, degraded, pgbaton.ErrDegraded)
	assert.ErrorContains(t, degraded, "keep-alive late by")
}

// The queue's order by rank holds when the leader is lost rather than
// resigning (its process paused past its TTL): the preferred candidate
// gets the next term, ahead of one of a lower rank that queued first.
func TestPreferredCandidateGetsTheTermAfterALoss(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	lead, err := newClient(t, pool, leasetable.Config{Owner: "v2-a"}).ElectWith(ctx, "leader", "a", leasetable.Preference(2))
	require.NoError(t, err)
	won := make(chan string, 2)
	elect := func(owner string, rank int32, queued int) {
		c := newClient(t, pool, leasetable.Config{Owner: owner})
		go func() {
			l, err := c.ElectWith(ctx, "leader", owner, leasetable.Preference(rank))
			if err != nil { // the loser, still waiting as the test ends
				assert.ErrorIs(t, err, pgbaton.ErrClosed)
				return
			}
			won <- owner
			<-l.Done() // until its client closes

		}()
		pgtest.Eventually(t, time.Minute, func() (bool, error) {
			return pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_queue WHERE name = 'leader'") == queued, nil
		}, "%s queued", owner)
	}
	elect("v1", 0, 1)
	elect("v2-b", 2, 2)
	require.NoError(t, pgbatontest.Expire(ctx, lead.Lease()))
	select {
	case who := <-won:
		assert.Equal(t, "v2-b", who)
	case <-ctx.Done():
		t.Fatal("nobody elected after the loss")
	}
	assert.ErrorIs(t, lead.Err(), leasetable.ErrLeaseLost)
	select {
	case <-lead.ResignRequested():
		t.Fatal("an equal rank asked the leader to yield")
	default:
	}
}

// An observer that does not read while terms go by is sent the leader of
// the moment when it reads again: terms it missed are skipped, and none
// arrives after a newer one.
func TestObserveSlowReaderSkipsButNeverGoesBack(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	ch, err := newClient(t, pool, leasetable.Config{Owner: "watcher"}).Observe(ctx, "churn")
	require.NoError(t, err)
	c := newClient(t, pool, leasetable.Config{Owner: "a"})
	var last *leasetable.Leadership
	for range 10 {
		if last != nil {
			require.NoError(t, last.Resign(ctx))
		}
		last, err = c.Elect(ctx, "churn", "x")
		require.NoError(t, err)
	}
	var prev int64
	for prev != last.Term() {
		got := receive(t, ch)
		require.Greater(t, got.Term, prev, "terms only grow")
		require.LessOrEqual(t, got.Term, last.Term())
		prev = got.Term
	}
	require.NoError(t, last.Resign(ctx))
}

// A polling candidate whose registration the database lost (the wait
// queue is unlogged: a crash or a failover empties it) queues again at
// its next look with its rank, not as a rank-0 newcomer behind candidates
// that came meanwhile. Before, lease_attempt queued it again at rank 0,
// and the older rank-0 candidate got the term.
func TestPollingCandidateKeepsItsRankWhenQueuedAgain(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	old := newClient(t, pool, leasetable.Config{Owner: "old"})
	ld, err := old.Elect(ctx, "leader", "v1")
	require.NoError(t, err)

	polling := leasetable.Config{NoListen: true, PollInterval: 50 * time.Millisecond}
	preferredCfg := polling
	preferredCfg.Owner = "preferred"
	preferred := newClient(t, pool, preferredCfg)
	won := make(chan *leasetable.Leadership, 2)
	go func() {
		l, err := preferred.ElectWith(ctx, "leader", "v2", leasetable.Preference(1))
		assert.NoError(t, err)
		won <- l
	}()
	pgtest.Eventually(t, time.Minute, func() (bool, error) {
		return pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_queue WHERE name = 'leader' AND owner = 'preferred'") == 1, nil
	}, "the preferred candidate queued")
	// Its registration is lost; a rank-0 candidate queues; the preferred
	// one queues again at its next look.
	_, err = pool.Exec(ctx, "DELETE FROM pgbaton.lease_waiter WHERE owner = 'preferred'")
	require.NoError(t, err)
	otherCfg := polling
	otherCfg.Owner = "other"
	other := newClient(t, pool, otherCfg)
	go func() {
		l, err := other.Elect(ctx, "leader", "v1")
		assert.NoError(t, err)
		won <- l
	}()
	pgtest.Eventually(t, time.Minute, func() (bool, error) {
		return pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_queue WHERE name = 'leader'") == 2, nil
	}, "both candidates queued")
	assert.Equal(t, 1, pgtest.Count(t, pool, "SELECT position::int FROM pgbaton.lease_queue WHERE name = 'leader' AND owner = 'preferred'"),
		"the preferred candidate queued again behind a rank-0 one")

	require.NoError(t, ld.Resign(ctx))
	var first *leasetable.Leadership
	select {
	case first = <-won:
	case <-ctx.Done():
		t.Fatal("nobody elected")
	}
	require.NotNil(t, first)
	leader, err := old.Leader(ctx, "leader")
	require.NoError(t, err)
	assert.Equal(t, "preferred", leader.Owner)
	require.NoError(t, first.Resign(ctx))
	require.NoError(t, (<-won).Resign(ctx))
}
