package pgbatontest_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/pgbatontest"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{})
	os.Exit(env.Run(m))
}

// longTTL is far longer than any test's context: whatever ends a lease in
// these tests, its TTL running out does not.
const longTTL = 10 * time.Minute

func newClient(t *testing.T, pool *pgxpool.Pool, owner string, ttl time.Duration) *leasetable.Client {
	t.Helper()
	c, err := leasetable.New(context.Background(), pool, leasetable.Config{Owner: owner, TTL: ttl})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, c.Close(ctx))
	})
	return c
}

// staleWrite is a fenced write with l's token: it must be refused once l
// is lost.
func staleWrite(t *testing.T, ctx context.Context, pool *pgxpool.Pool, l *leasetable.Lease) error {
	t.Helper()
	_, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS ledger (entry text)")
	require.NoError(t, err)
	return fencedwrite.InTx(ctx, pool, l, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO ledger VALUES ('late')")
		return err
	})
}

// Each fault ends the lease on its client before the helper returns, with
// the error the real fault gives, and leaves the database as the real fault
// would: the lease granted again at once with a larger token, the old
// token's fenced writes refused, a waiter already waiting woken.
func TestFaultsEndTheLeaseAtOnce(t *testing.T) {
	cases := []struct {
		name      string
		fault     func(ctx context.Context, l *leasetable.Lease) error
		want      []error
		notWanted error
	}{
		{"Expire", pgbatontest.Expire, []error{leasetable.ErrLeaseLost}, leasetable.ErrClockStep},
		{"StepClock", pgbatontest.StepClock, []error{leasetable.ErrLeaseLost, leasetable.ErrClockStep}, nil},
		{"TakeOver", func(ctx context.Context, l *leasetable.Lease) error {
			_, err := pgbatontest.TakeOver(ctx, l, "intruder")
			return err
		}, []error{leasetable.ErrLeaseLost, leasetable.ErrNotHeld}, nil},
		{"ForceRelease", func(ctx context.Context, l *leasetable.Lease) error {
			return pgbatontest.ForceRelease(ctx, l, "test: a wedged worker")
		}, []error{leasetable.ErrLeaseLost, leasetable.ErrNotHeld}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := pgtest.Context(t, 30*time.Second)
			pool := env.DB(t).Pool(t)
			holder := newClient(t, pool, "holder", longTTL)
			waiter := newClient(t, pool, "waiter", longTTL)
			l, err := holder.Acquire(ctx, "job")
			require.NoError(t, err)

			waited := make(chan *leasetable.Lease, 1)
			waitErr := make(chan error, 1)
			go func() {
				w, err := waiter.Acquire(ctx, "job")
				waitErr <- err
				waited <- w
			}()
			// The waiter is queued before the fault, so only the fault's
			// wake-up can grant it (its TTL wait is longer than ctx).
			pgtest.Eventually(t, 20*time.Second, func() (bool, error) {
				return pgtest.Count(t, pool, "SELECT count(*) FROM pgbaton.lease_queue WHERE name = 'job'") == 1, nil
			}, "the waiter is queued")

			require.NoError(t, tc.fault(ctx, l))
			select {
			case <-l.Done():
			default:
				t.Fatal("the lease's Done is not closed when the helper returns")
			}
			for _, want := range tc.want {
				assert.ErrorIs(t, l.Err(), want)
			}
			if tc.notWanted != nil {
				assert.NotErrorIs(t, l.Err(), tc.notWanted)
			}
			var stale *fencedwrite.StaleTokenError
			assert.ErrorAs(t, staleWrite(t, ctx, pool, l), &stale, "the old token writes nothing")

			if tc.name == "TakeOver" {
				// The intruder holds it until its TTL: the waiter stays queued.
				pgbatontest.RequireHeld(t, pool, "job", "intruder")
				return
			}
			require.NoError(t, <-waitErr, "the waiter is woken and granted")
			w := <-waited
			assert.Greater(t, w.Token(), l.Token())
			pgbatontest.RequireHeld(t, pool, "job", "waiter")
		})
	}
}

func TestTakeOverGivesTheNewOwnerALargerToken(t *testing.T) {
	ctx := pgtest.Context(t, 30*time.Second)
	pool := env.DB(t).Pool(t)
	c := newClient(t, pool, "worker-1", longTTL)
	l, err := c.Acquire(ctx, "shard-7")
	require.NoError(t, err)
	token, err := pgbatontest.TakeOver(ctx, l, "worker-2")
	require.NoError(t, err)
	assert.Greater(t, token, l.Token())
	assert.Equal(t, token, pgbatontest.RequireHeld(t, pool, "shard-7", "worker-2"))
	_, err = c.TryAcquire(ctx, "shard-7")
	assert.ErrorIs(t, err, leasetable.ErrHeld, "worker-2 holds it for the client's TTL")
}

func TestForceReleaseIsAudited(t *testing.T) {
	ctx := pgtest.Context(t, 30*time.Second)
	pool := env.DB(t).Pool(t)
	c := newClient(t, pool, "worker-1", longTTL)
	l, err := c.Acquire(ctx, "nightly")
	require.NoError(t, err)
	require.NoError(t, pgbatontest.ForceRelease(ctx, l, "test: stuck"))
	pgbatontest.RequireFree(t, pool, "nightly")
	var reason string
	var old int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT reason, old_token FROM pgbaton.event WHERE target = 'nightly'").Scan(&reason, &old))
	assert.Equal(t, "test: stuck", reason)
	assert.Equal(t, l.Token(), old)
}

// A leader change: the term ends, another candidate's term begins with a
// larger token, and the old leader stops leading (at its next keep-alive).
func TestChangeLeader(t *testing.T) {
	ctx := pgtest.Context(t, 60*time.Second)
	pool := env.DB(t).Pool(t)
	type term struct {
		owner string
		term  int64
		ctx   context.Context
	}
	terms := make(chan term, 16)
	for _, owner := range []string{"a", "b"} {
		c := newClient(t, pool, owner, 3*time.Second)
		campaign, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		t.Cleanup(func() { stop(); <-done })
		go func() {
			defer close(done)
			_ = c.Campaign(campaign, "leader", owner, pgbaton.Callbacks{OnStartedLeading: func(ctx context.Context, tm int64) {
				terms <- term{owner, tm, ctx}
				<-ctx.Done()
			}})
		}()
	}
	first := <-terms
	h, err := pgbatontest.ChangeLeader(ctx, pool, "leader", "test: rolling restart")
	require.NoError(t, err)
	assert.Greater(t, h.Token, first.term)
	select {
	case <-first.ctx.Done():
	case <-ctx.Done():
		t.Fatal("the old leader never stopped leading")
	}
	next := <-terms
	assert.Equal(t, h.Token, next.term, "the new term is the one ChangeLeader returned")
	assert.Equal(t, h.Owner, next.owner)
}

func TestBadInputAndEndedLeases(t *testing.T) {
	ctx := pgtest.Context(t, 30*time.Second)
	pool := env.DB(t).Pool(t)
	c := newClient(t, pool, "w", longTTL)

	assert.ErrorIs(t, pgbatontest.Expire(ctx, nil), pgbaton.ErrInvalidArgument)
	_, err := pgbatontest.TakeOver(ctx, nil, "x")
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	_, err = pgbatontest.Holder(ctx, nil, "x")
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	_, err = pgbatontest.ChangeLeader(ctx, pool, "", "r")
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	_, err = pgbatontest.ChangeLeader(ctx, pool, "nobody-leads", "r")
	assert.ErrorIs(t, err, leasetable.ErrNoLeader)

	l, err := c.Acquire(ctx, "job")
	require.NoError(t, err)
	_, err = pgbatontest.TakeOver(ctx, l, "")
	assert.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	assert.NoError(t, l.Err(), "a refused fault changes nothing")

	require.NoError(t, pgbatontest.Expire(ctx, l))
	assert.ErrorIs(t, pgbatontest.Expire(ctx, l), leasetable.ErrLeaseLost, "a lease ends once")

	// A grant the client still believes in, but the database no longer
	// holds: the fault needs a held grant.
	l2, err := c.Acquire(ctx, "other")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "SELECT pgbaton.force_release_lease('other', 'behind the client''s back')")
	require.NoError(t, err)
	err = pgbatontest.Expire(ctx, l2)
	assert.ErrorIs(t, err, leasetable.ErrNotHeld)
	assert.NoError(t, l2.Err(), "a refused fault changes nothing on the client")
	err = pgbatontest.ForceRelease(ctx, l2, "again")
	assert.True(t, errors.Is(err, leasetable.ErrNotHeld), "%v", err)
}
