package test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// campaigner is one candidate of an election through one of the lock
// layers; both run the same campaign loop, and these tests hold each to
// the same behaviour.
type campaigner interface {
	Campaign(ctx context.Context, cb pgbaton.Callbacks) error
	// Depose takes leadership away from this candidate as a real fault
	// would: its session is terminated (advisory), or an operator
	// force-releases its lease (leases).
	Depose(t *testing.T)
	// LostCause is what a lost term's context ends with.
	LostCause() error
	Close()
}

type layer struct {
	name string
	new  func(t *testing.T, pool *pgxpool.Pool, election, owner string) campaigner
}

var layers = []layer{
	{"advisory", newAdvisoryCampaigner},
	{"leasetable", newLeaseCampaigner},
}

type advisoryCampaigner struct {
	l        *advisory.Locker
	pool     *pgxpool.Pool
	key      advisory.Key
	election string
}

func newAdvisoryCampaigner(t *testing.T, pool *pgxpool.Pool, election, owner string) campaigner {
	l, err := advisory.New(pool, advisory.Config{Owner: owner, RetryDelay: 50 * time.Millisecond})
	require.NoError(t, err)
	return &advisoryCampaigner{l: l, pool: pool, key: advisory.Name(election), election: election}
}

func (a *advisoryCampaigner) Campaign(ctx context.Context, cb pgbaton.Callbacks) error {
	return a.l.Campaign(ctx, a.key, cb)
}

func (a *advisoryCampaigner) Depose(t *testing.T) {
	// The backend holding the election's lock goes away.
	var pid uint32
	require.NoError(t, a.pool.QueryRow(context.Background(), `
SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
   AND (l.classid::bigint << 32 | l.objid::bigint) = pgbaton.advisory_key($1)`, a.election).Scan(&pid))
	env.Terminate(t, pid)
}

func (a *advisoryCampaigner) LostCause() error { return advisory.ErrLockLost }
func (a *advisoryCampaigner) Close()           { _ = a.l.Close(context.Background()) }

type leaseCampaigner struct {
	c        *leasetable.Client
	pool     *pgxpool.Pool
	election string
}

func newLeaseCampaigner(t *testing.T, pool *pgxpool.Pool, election, owner string) campaigner {
	c, err := leasetable.New(context.Background(), pool, leasetable.Config{Owner: owner, TTL: time.Second, RenewInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	return &leaseCampaigner{c: c, pool: pool, election: election}
}

func (l *leaseCampaigner) Campaign(ctx context.Context, cb pgbaton.Callbacks) error {
	return l.c.Campaign(ctx, l.election, l.c.Owner(), cb)
}

func (l *leaseCampaigner) Depose(t *testing.T) {
	_, err := l.pool.Exec(context.Background(), "SELECT pgbaton.force_release_lease($1, 'test')", l.election)
	require.NoError(t, err)
}

func (l *leaseCampaigner) LostCause() error { return leasetable.ErrLeaseLost }
func (l *leaseCampaigner) Close()           { _ = l.c.Close(context.Background()) }

// termLog records terms: who led, when, with which term number, and
// whether OnStoppedLeading followed each.
type termLog struct {
	mu      sync.Mutex
	leading map[string]bool
	terms   []termRec
	errs    []string
	// deposed: leadership is taken away by a fault, which frees it on the
	// server before the old leader's callback can learn of it (fenced
	// writes close that window), so a new term may start first.
	deposed bool
}

type termRec struct {
	who        string
	number     int64
	start, end time.Time
	stopped    bool
}

func (tl *termLog) callbacks(who string, during func(ctx context.Context)) pgbaton.Callbacks {
	return pgbaton.Callbacks{
		OnStartedLeading: func(ctx context.Context, number int64) {
			tl.mu.Lock()
			for other, on := range tl.leading {
				if on && !tl.deposed {
					tl.errs = append(tl.errs, fmt.Sprintf("%s started leading while %s led", who, other))
				}
			}
			tl.leading[who] = true
			tl.terms = append(tl.terms, termRec{who: who, number: number, start: time.Now()})
			i := len(tl.terms) - 1
			tl.mu.Unlock()
			during(ctx)
			tl.mu.Lock()
			tl.leading[who] = false
			tl.terms[i].end = time.Now()
			tl.mu.Unlock()
		},
		OnStoppedLeading: func() {
			tl.mu.Lock()
			defer tl.mu.Unlock()
			for i := len(tl.terms) - 1; i >= 0; i-- {
				if tl.terms[i].who == who {
					if tl.terms[i].stopped {
						tl.errs = append(tl.errs, who+": OnStoppedLeading twice for one term")
					}
					tl.terms[i].stopped = true
					return
				}
			}
			tl.errs = append(tl.errs, who+": OnStoppedLeading without a term")
		},
	}
}

// Three candidates; each term works a little and returns. Terms never
// overlap, each is followed by OnStoppedLeading, leadership changes hands,
// and term numbers grow (leases) or are 0 (advisory).
func TestCampaignOneLeaderAtATime(t *testing.T) {
	for _, ly := range layers {
		t.Run(ly.name, func(t *testing.T) {
			pool := env.DB(t).Pool(t)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			tl := &termLog{leading: map[string]bool{}}
			var wg sync.WaitGroup
			for i := range 3 {
				who := fmt.Sprintf("c%d", i)
				c := ly.new(t, pool, "e1", who)
				defer c.Close()
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := c.Campaign(ctx, tl.callbacks(who, func(ctx context.Context) {
						select {
						case <-time.After(100 * time.Millisecond): // a term's work
						case <-ctx.Done():
						}
					}))
					assert.ErrorIs(t, err, context.DeadlineExceeded)
				}()
			}
			wg.Wait()
			tl.mu.Lock()
			defer tl.mu.Unlock()
			require.Empty(t, tl.errs)
			require.GreaterOrEqual(t, len(tl.terms), 5)
			leaders := map[string]bool{}
			for i, tr := range tl.terms {
				leaders[tr.who] = true
				assert.True(t, tr.stopped, "term %d of %s had no OnStoppedLeading", i, tr.who)
				if i > 0 {
					assert.False(t, tr.start.Before(tl.terms[i-1].end), "terms %d and %d overlap", i-1, i)
					if ly.name == "leasetable" {
						assert.Greater(t, tr.number, tl.terms[i-1].number, "lease terms grow")
					}
				}
				if ly.name == "advisory" {
					assert.Zero(t, tr.number)
				}
			}
			assert.Greater(t, len(leaders), 1, "leadership never changed hands")
		})
	}
}

// A leader deposed by a real fault learns it through its term's context
// (cause ErrLockLost or ErrLeaseLost), OnStoppedLeading runs, and another
// candidate leads next.
func TestCampaignLossEndsTheTerm(t *testing.T) {
	for _, ly := range layers {
		t.Run(ly.name, func(t *testing.T) {
			pool := env.DB(t).Pool(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			tl := &termLog{leading: map[string]bool{}, deposed: true}
			started := make(chan string, 10)
			causes := make(chan error, 10)
			cands := map[string]campaigner{}
			var wg sync.WaitGroup
			for i := range 2 {
				who := fmt.Sprintf("c%d", i)
				c := ly.new(t, pool, "e2", who)
				defer c.Close()
				cands[who] = c
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = c.Campaign(ctx, tl.callbacks(who, func(ctx context.Context) {
						started <- who
						<-ctx.Done() // lead until deposed
						causes <- context.Cause(ctx)
					}))
				}()
			}
			first := <-started
			cands[first].Depose(t)
			cause := <-causes
			require.ErrorIs(t, cause, cands[first].LostCause())
			second := <-started
			assert.NotEqual(t, first, second, "the other candidate leads next")
			cancel()
			wg.Wait()
			tl.mu.Lock()
			defer tl.mu.Unlock()
			require.Empty(t, tl.errs)
			assert.True(t, tl.terms[0].stopped)
		})
	}
}

// Campaign refuses bad input and returns at once what retrying cannot
// fix (a closed Locker or Client); a candidate leading when ctx ends
// resigns on its way out.
func TestCampaignEnds(t *testing.T) {
	for _, ly := range layers {
		t.Run(ly.name, func(t *testing.T) {
			pool := env.DB(t).Pool(t)
			ctx := pgtest.Context(t, 30*time.Second)
			c := ly.new(t, pool, "e3", "a")
			require.ErrorIs(t, c.Campaign(ctx, pgbaton.Callbacks{}), pgbaton.ErrInvalidArgument)

			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- c.Campaign(cctx, pgbaton.Callbacks{OnStartedLeading: func(ctx context.Context, _ int64) {
					cancel()
					<-ctx.Done()
				}})
			}()
			require.ErrorIs(t, <-done, context.Canceled)
			other := ly.new(t, pool, "e3", "b")
			defer other.Close()
			led := make(chan struct{})
			octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
			defer ocancel()
			go func() {
				_ = other.Campaign(octx, pgbaton.Callbacks{OnStartedLeading: func(context.Context, int64) {
					close(led)
					ocancel()
				}})
			}()
			select {
			case <-led:
			case <-octx.Done():
				t.Fatal("the first candidate did not resign when its campaign ended")
			}

			c.Close()
			err := c.Campaign(ctx, pgbaton.Callbacks{OnStartedLeading: func(context.Context, int64) {}})
			require.True(t, errors.Is(err, pgbaton.ErrClosed), "closed: %v", err)
		})
	}
}
