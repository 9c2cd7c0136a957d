package leasetable_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/migrations"
)

// childExclusive runs Do(args[1]) args[2] times; inside, it counts itself
// in table excl and prints "violation" if anyone else is inside too.
func childExclusive(ctx context.Context, args []string) error {
	rounds, _ := strconv.Atoi(args[2])
	c, closeFn, err := childClient(ctx, args[0], 2*time.Second)
	if err != nil {
		return err
	}
	defer closeFn()
	pool, err := pgxpool.New(ctx, args[0])
	if err != nil {
		return err
	}
	defer pool.Close()
	for range rounds {
		err := c.Do(ctx, args[1], func(ctx context.Context) error {
			var inside int
			if err := pool.QueryRow(ctx, "UPDATE excl SET inside = inside + 1, total = total + 1 RETURNING inside").Scan(&inside); err != nil {
				return err
			}
			if inside != 1 {
				pgtest.Printf("violation %d", inside)
			}
			_, err := pool.Exec(ctx, "SELECT pg_sleep(0.002); UPDATE excl SET inside = inside - 1")
			return err
		})
		if err != nil {
			return err
		}
	}
	pgtest.Printf("finished")
	return nil
}

func TestExclusionAcrossProcesses(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 2*time.Minute)
	_, err := pool.Exec(ctx, "CREATE TABLE excl (inside int, total int); INSERT INTO excl VALUES (0, 0)")
	require.NoError(t, err)
	const procs, rounds = 3, 30
	var kids []*pgtest.Child
	for range procs {
		kids = append(kids, env.StartChild(t, "exclusive", d.URL, "crit", strconv.Itoa(rounds)))
	}
	for _, k := range kids {
		require.NoError(t, k.Wait(t, 90*time.Second), k.Stderr())
		assert.NotContains(t, k.Stderr(), "violation")
	}
	var inside, total int
	require.NoError(t, pool.QueryRow(ctx, "SELECT inside, total FROM excl").Scan(&inside, &total))
	assert.Zero(t, inside)
	assert.Equal(t, procs*rounds, total)
}

func TestSIGSTOPHolderLosesBeforeTakeover(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	k := env.StartChild(t, "hold", d.URL, "paused", shortTTL.String())
	oldTok, err := strconv.ParseInt(k.Expect(t, "token", 30*time.Second), 10, 64)
	require.NoError(t, err)
	k.Signal(t, syscall.SIGSTOP)
	c := newClient(t, pool, leasetable.Config{Owner: "taker", TTL: shortTTL})
	l, err := c.Acquire(ctx, "paused") // granted once the paused grant expires
	require.NoError(t, err)
	assert.Greater(t, l.Token(), oldTok)
	k.Signal(t, syscall.SIGCONT)
	// On resume the child's Done has fired (its local deadline passed long
	// ago); it reports the loss before doing anything else.
	ended := k.Expect(t, "ended", 10*time.Second)
	assert.Contains(t, ended, "lease lost")
	require.NoError(t, k.Wait(t, 10*time.Second), k.Stderr())
	assert.NoError(t, l.Err(), "the new holder keeps the lease")
}

func TestSIGKILLHolderTakenOverWithinTTL(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	k := env.StartChild(t, "hold", d.URL, "killed", shortTTL.String())
	oldTok, err := strconv.ParseInt(k.Expect(t, "token", 30*time.Second), 10, 64)
	require.NoError(t, err)
	// Neither the taker's TTL nor its PollInterval brings it within
	// seconds of the expiry: only a wait for the expiry it was told does.
	c := newClient(t, pool, leasetable.Config{Owner: "taker", TTL: 30 * time.Second, PollInterval: time.Minute})
	_, err = c.TryAcquire(ctx, "killed")
	require.ErrorIs(t, err, leasetable.ErrHeld)
	killed := time.Now()
	k.Signal(t, syscall.SIGKILL)
	l, err := c.Acquire(ctx, "killed")
	require.NoError(t, err)
	took := time.Since(killed)
	t.Logf("takeover %s after SIGKILL (TTL %s)", took, shortTTL)
	assert.Greater(t, l.Token(), oldTok)
	assert.Less(t, took, shortTTL+5*time.Second, "the taker did not wait for the expiry it was told")
}

// childClaimer claims up to args[2] leases of group args[1], with TTL
// args[3] if given (else shortTTL), prints "claimed a,b,c" and holds them
// until killed.
func childClaimer(ctx context.Context, args []string) error {
	n, _ := strconv.Atoi(args[2])
	ttl := shortTTL
	if len(args) > 3 {
		var err error
		if ttl, err = time.ParseDuration(args[3]); err != nil {
			return err
		}
	}
	c, closeFn, err := childClient(ctx, args[0], ttl)
	if err != nil {
		return err
	}
	defer closeFn()
	ls, err := c.Claim(ctx, args[1], n)
	if err != nil {
		return err
	}
	names := make([]string, len(ls))
	for i, l := range ls {
		names[i] = l.Name()
	}
	pgtest.Printf("claimed %s", strings.Join(names, ","))
	<-ctx.Done()
	return nil
}

func TestClaimCoverageAndRebalance(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	const shards, workers = 24, 3
	names := make([]string, shards)
	for i := range names {
		names[i] = fmt.Sprintf("shard-%02d", i)
	}
	reg := newClient(t, pool, leasetable.Config{})
	created, err := reg.Register(ctx, "shards", names...)
	require.NoError(t, err)
	require.Equal(t, shards, created)
	again, err := reg.Register(ctx, "shards", names...)
	require.NoError(t, err)
	assert.Zero(t, again, "registering twice creates nothing")

	// One worker is another process, to be killed; two are in here.
	k := env.StartChild(t, "claimer", d.URL, "shards", strconv.Itoa(shards/workers))
	dead := strings.Split(k.Expect(t, "claimed", 30*time.Second), ",")
	require.Len(t, dead, shards/workers)
	owner := map[string]string{}
	for _, n := range dead {
		owner[n] = "child"
	}
	var live []*leasetable.Client
	for w := range workers - 1 {
		c := newClient(t, pool, leasetable.Config{Owner: "w" + strconv.Itoa(w), TTL: shortTTL})
		live = append(live, c)
		ls, err := c.Claim(ctx, "shards", shards/workers)
		require.NoError(t, err)
		require.Len(t, ls, shards/workers)
		for _, l := range ls {
			require.NotContains(t, owner, l.Name(), "shard claimed twice")
			owner[l.Name()] = c.Owner()
		}
	}
	require.Len(t, owner, shards, "full coverage")
	// Nothing is left to claim.
	none, err := live[0].Claim(ctx, "shards", 1)
	require.NoError(t, err)
	assert.Empty(t, none)

	// The child dies; its shards free at expiry and the others take them.
	k.Signal(t, syscall.SIGKILL)
	got := map[string]bool{}
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		for _, c := range live {
			ls, err := c.Claim(ctx, "shards", 2)
			if err != nil {
				return false, err
			}
			for _, l := range ls {
				if got[l.Name()] || owner[l.Name()] != "child" {
					return false, fmt.Errorf("claimed %s, owned by %s, again", l.Name(), owner[l.Name()])
				}
				got[l.Name()] = true
			}
		}
		return len(got) == len(dead), nil
	}, "dead worker's shards not all taken over: %v", got)
}

func TestLeaseSurvivesServerCrash(t *testing.T) {
	// A durable cluster of its own: the shared one runs without fsync and
	// synchronous_commit, where a crash loses the last commits (and the
	// client then rightly sees its renewals refused).
	cl := pgtest.NewCluster(t, pgcluster.Config{})
	ctx := pgtest.Context(t, 2*time.Minute)
	require.NoError(t, migrations.UpURL(ctx, cl.URL("postgres")))
	pool := pgtest.Pool(t, cl.URL("postgres"))
	c := newClient(t, pool, leasetable.Config{TTL: 10 * time.Second, RenewInterval: 500 * time.Millisecond})
	l, err := c.TryAcquire(ctx, "durable")
	require.NoError(t, err)
	before := l.ExpiresAt()
	// Crash: recovery replays the WAL.
	require.NoError(t, cl.Restart(ctx, pgcluster.Immediate))
	// Renewals resume on new connections; the lease was never lost.
	pgtest.Eventually(t, 20*time.Second, func() (bool, error) {
		return l.ExpiresAt().After(before.Add(time.Second)), l.Err()
	}, "no renewal after the restart")
	in, err := c.Info(ctx, "durable")
	require.NoError(t, err)
	assert.True(t, in.Held)
	assert.Equal(t, l.Token(), in.Token)
	// The token sequence is logged: it never goes back after a crash.
	l2, err := c.TryAcquire(ctx, "after-crash")
	require.NoError(t, err)
	assert.Greater(t, l2.Token(), l.Token())
}

// A Semaphore waits out a server that cannot be reached, until its
// context ends, as Acquire and ClaimWait do: it used to return the
// connection error of its first look during the outage. The waiter looks
// at the holder's expiry (a TTL of 2s), so it looks while the server is
// down for 3s.
func TestSemaphoreWaitsOutAnOutage(t *testing.T) {
	cl := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true})
	ctx := pgtest.Context(t, 2*time.Minute)
	require.NoError(t, migrations.UpURL(ctx, cl.URL("postgres")))
	pool := pgtest.Pool(t, cl.URL("postgres"))
	const ttl = 2 * time.Second
	holder := newClient(t, pool, leasetable.Config{Owner: "holder", TTL: ttl})
	waiter := newClient(t, pool, leasetable.Config{Owner: "waiter", TTL: ttl})
	_, err := holder.Semaphore(ctx, "sem", 1)
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		l, err := waiter.Semaphore(ctx, "sem", 1)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	queued(t, ctx, pool, "sem", 1)
	require.NoError(t, cl.Halt(pgcluster.Immediate))
	time.Sleep(3 * time.Second) // the outage itself
	require.NoError(t, cl.Restart(ctx, pgcluster.Immediate))
	// The holder's permit expired during the outage: the waiter gets it.
	require.NoError(t, <-got)
}

func TestPartitionedHolderLearnsFirst(t *testing.T) {
	if env.Cluster() == nil {
		t.Skip("needs the throwaway cluster") // only with PGBATON_TEST_DSN
	}
	d := env.DB(t)
	pool := d.Pool(t)
	proxied, proxy := env.ProxiedPool(t, d)
	ctx := pgtest.Context(t, time.Minute)
	a := newClient(t, proxied, leasetable.Config{Owner: "partitioned", TTL: shortTTL})
	b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: shortTTL})
	la, err := a.TryAcquire(ctx, "p")
	require.NoError(t, err)
	proxy.Stall() // silence: no error, no reset, renewals just hang
	defer proxy.Resume()
	lb, err := b.Acquire(ctx, "p")
	require.NoError(t, err)
	select {
	case <-la.Done():
	default:
		t.Fatal("new holder granted before the partitioned holder's Done fired")
	}
	assert.ErrorIs(t, la.Err(), leasetable.ErrLeaseLost)
	assert.Greater(t, lb.Token(), la.Token())
	// Back online, the old holder cannot release the new holder's lease.
	proxy.Resume()
	require.ErrorIs(t, la.Release(ctx), leasetable.ErrNotHeld)
	assert.NoError(t, lb.Err())
	in, err := b.Info(ctx, "p")
	require.NoError(t, err)
	assert.Equal(t, "b", in.Owner)
}

func TestRenewalRetriesAfterConnectionReset(t *testing.T) {
	if env.Cluster() == nil {
		t.Skip("needs the throwaway cluster") // only with PGBATON_TEST_DSN
	}
	d := env.DB(t)
	proxied, proxy := env.ProxiedPool(t, d)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, proxied, leasetable.Config{TTL: 2 * time.Second, RenewInterval: 300 * time.Millisecond})
	l, err := c.TryAcquire(ctx, "r")
	require.NoError(t, err)
	for range 3 {
		before := l.ExpiresAt()
		proxy.Cut() // every connection gets RST; the pool opens new ones
		pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
			return l.ExpiresAt().After(before), l.Err()
		}, "no renewal after the connections were reset")
	}
	require.NoError(t, l.Release(ctx))
}

// A release that cannot reach the server (here: a silent partition) fails,
// and the lease must not then live on with the client's session, renewed
// by every keep-alive: the client gives it back as soon as it reaches the
// server again, long before the lease's own TTL. (Seen in the HA test bed:
// after a switchover every lease whose release fell into the outage
// blocked its waiters for a whole TTL after the new primary was up.)
func TestFailedReleaseIsGivenBackWhenTheServerIsBack(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	proxied, proxy := env.ProxiedPool(t, d)
	ctx := pgtest.Context(t, time.Minute)
	const ttl = 10 * time.Second
	a := newClient(t, proxied, leasetable.Config{Owner: "a", TTL: ttl, RenewInterval: 200 * time.Millisecond, ReleaseTimeout: 300 * time.Millisecond})
	b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: ttl})
	la, err := a.TryAcquire(ctx, "back")
	require.NoError(t, err)

	proxy.Stall()
	// No deadline of its own: ReleaseTimeout bounds the release.
	err = la.Release(context.Background())
	proxy.Resume()
	require.Error(t, err, "a release through a stalled connection cannot succeed")
	require.NotErrorIs(t, err, leasetable.ErrNotHeld)

	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, ttl/2)
	defer cancel()
	lb, err := b.Acquire(actx, "back")
	require.NoError(t, err, "the failed release was not given back once the server was reachable again")
	t.Logf("given back %s after the partition ended (TTL %s)", time.Since(start).Round(time.Millisecond), ttl)
	require.NoError(t, lb.Release(ctx))
	require.NoError(t, a.Close(ctx), "nothing left for Close to give back")
}
