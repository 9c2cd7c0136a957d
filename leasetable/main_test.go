package leasetable_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/faultproxy"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{Children: children})
	os.Exit(env.Run(m))
}

// children run in separate OS processes of the test binary. Their first
// argument is always the database URL.
var children = map[string]pgtest.ChildFunc{
	"hold":      childHold,
	"exclusive": childExclusive,
	"claimer":   childClaimer,
	"keeper":    childKeeper,
	"meterhold": childMeterHold,
	"worker":    childWorker,
}

// shortTTL keeps fault tests quick: losses and takeovers happen within a
// second or two.
const shortTTL = time.Second

func newClient(t testing.TB, pool *pgxpool.Pool, cfg leasetable.Config) *leasetable.Client {
	t.Helper()
	c, err := leasetable.New(context.Background(), pool, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, c.Close(ctx))
	})
	return c
}

// slowLinkWorker registers items in the group "items" of a new database
// and returns a pool on it and a client named owner (TTL one minute) whose
// pool goes through a fault proxy, sending one round trip per statement
// (no separate prepare): with latency set, a request is on the server
// before a caller that gives up midway returns.
func slowLinkWorker(t *testing.T, ctx context.Context, owner string, items ...string) (direct *pgxpool.Pool, c *leasetable.Client, pool *pgxpool.Pool, proxy *faultproxy.Proxy) {
	t.Helper()
	d := env.DB(t)
	direct = d.Pool(t)
	_, err := newClient(t, direct, leasetable.Config{Owner: "registrar"}).Register(ctx, "items", items...)
	require.NoError(t, err)
	pool, proxy = env.ProxiedPool(t, d, func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec })
	return direct, newClient(t, pool, leasetable.Config{Owner: owner, TTL: time.Minute}), pool, proxy
}

// giveUpWithReplyHeld runs call on a client whose pool goes through
// proxy (slowLinkWorker) and gives it up once the server has committed
// the statement matching blocked (a LIKE pattern of pg_stat_activity's
// query) while its reply is held back in the link, then requires call to
// return context.Canceled at once: a caller returns when its context
// ends, not when the reply comes. committed reports whether the server
// has committed. The link is resumed before it returns, so the reply
// comes then.
//
// The events are ordered, not timed (a slow link's latency against the
// caller's deadline was, and load ate it): a lock on pgbaton.lease holds
// the statement on the server until the link is stalled.
func giveUpWithReplyHeld(t *testing.T, ctx context.Context, direct *pgxpool.Pool, proxy *faultproxy.Proxy,
	blocked string, call func(context.Context) error, committed func() bool) {
	t.Helper()
	tx, err := direct.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "LOCK TABLE pgbaton.lease IN EXCLUSIVE MODE") // plain reads go on
	require.NoError(t, err)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	returned := make(chan error, 1)
	go func() { returned <- call(cctx) }()
	pgtest.Eventually(t, 20*time.Second, func() (bool, error) {
		return pgtest.Count(t, direct, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1`, blocked) > 0, nil
	}, "the statement (%s) did not reach the server", blocked)
	proxy.Stall()
	defer proxy.Resume()
	require.NoError(t, tx.Commit(ctx))
	pgtest.Eventually(t, 20*time.Second, func() (bool, error) { return committed(), nil },
		"the statement (%s) did not commit", blocked)
	cancel() // the reply is held in the link
	select {
	case err := <-returned:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(20 * time.Second):
		t.Fatal("the caller did not return when its context ended: it waits for the reply")
	}
}

// childClient opens a pool and client in a child process; lockDelay is
// its Config.LockDelay, if given.
func childClient(ctx context.Context, url string, ttl time.Duration, lockDelay ...time.Duration) (*leasetable.Client, func(), error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	cfg := leasetable.Config{TTL: ttl, Owner: "child-" + strconv.Itoa(os.Getpid())}
	for _, d := range lockDelay {
		cfg.LockDelay = d
	}
	c, err := leasetable.New(ctx, pool, cfg)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return c, func() { _ = c.Close(ctx); pool.Close() }, nil
}

// childHold acquires args[1] with TTL args[2], prints "token N", then
// waits for the lease to end and prints "ended <cause>", then exits. With
// a Config.LockDelay args[3], it then also gives the lease back as a
// deferred Release would and prints "released <error>".
func childHold(ctx context.Context, args []string) error {
	ttl, err := time.ParseDuration(args[2])
	if err != nil {
		return err
	}
	var delay time.Duration
	if len(args) > 3 {
		if delay, err = time.ParseDuration(args[3]); err != nil {
			return err
		}
	}
	c, closeFn, err := childClient(ctx, args[0], ttl, delay)
	if err != nil {
		return err
	}
	defer closeFn()
	l, err := c.Acquire(ctx, args[1])
	if err != nil {
		return err
	}
	pgtest.Printf("token %d", l.Token())
	<-l.Done()
	// Done may have fired while this process was stopped; say so at once.
	pgtest.Printf("ended %v", l.Err())
	if !errors.Is(l.Err(), leasetable.ErrLeaseLost) {
		return fmt.Errorf("lease ended with %v, want ErrLeaseLost", l.Err())
	}
	if delay > 0 {
		pgtest.Printf("released %v", l.Release(ctx))
	}
	return nil
}

// acquired is the result of a call that grants a lease, run on a
// goroutine of its own (goAcquire).
type acquired struct {
	l   *leasetable.Lease
	err error
}

// goAcquire runs acquire on a goroutine of its own; its result comes on
// the channel.
func goAcquire(acquire func() (*leasetable.Lease, error)) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, err := acquire()
		ch <- acquired{l, err}
	}()
	return ch
}

// logTo returns a logger that sends the lease, semaphore or group name of
// every "waiting" debug message to ch: tests learn that a waiter is waiting
// without sleeping.
func logTo(ch chan<- string) *slog.Logger {
	return slog.New(waitHandler{ch})
}

type waitHandler struct{ ch chan<- string }

func (h waitHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h waitHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "pgbaton: waiting for lease" || r.Message == "pgbaton: waiting for semaphore" || r.Message == "pgbaton: waiting to claim" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "lease" || a.Key == "semaphore" || a.Key == "group" {
				select {
				case h.ch <- a.Value.String():
				default:
				}
				return false
			}
			return true
		})
	}
	return nil
}
func (h waitHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h waitHandler) WithGroup(string) slog.Handler      { return h }

// listenConn is a pooled connection listening on pgbaton_lease, for tests
// that look at the notifications themselves.
func listenConn(t *testing.T, ctx context.Context, pool *pgxpool.Pool) *pgx.Conn {
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "UNLISTEN *")
		conn.Release()
	})
	_, err = conn.Exec(ctx, "LISTEN pgbaton_lease")
	require.NoError(t, err)
	return conn.Conn()
}

func percentile(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, len(s)*p/100)]
}

// examplePool gives an Example function, which has no testing.T, a fresh
// migrated database; done drops it.
func examplePool() (*pgxpool.Pool, func()) { return env.ExamplePool() }

// awaitKeepaliveBlocked waits until a keep-alive waits for the row lock of
// pgtest.BlockKeepalives, or l has ended. A client sends one keep-alive at
// a time, so the one before it has moved the deadline by then: read
// before, a Deadline could still be moved by a keep-alive that committed
// before the lock and whose reply was on its way (a loaded machine made
// that take long enough). A session whose keep-alive came too late on a
// loaded machine (a short TTL, stalled goroutines) ends without another
// one, and its lease with it: its Deadline is final then too.
func awaitKeepaliveBlocked(t *testing.T, pool *pgxpool.Pool, l *leasetable.Lease) {
	t.Helper()
	pgtest.Eventually(t, 20*time.Second, func() (bool, error) {
		return l.Err() != nil || pgtest.KeepaliveBlocked(t, pool), nil
	}, "no keep-alive waited for the blocked session row, and the lease is held")
}
