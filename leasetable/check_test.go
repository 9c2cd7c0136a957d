package leasetable_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/health"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

var _ health.Checker = (*leasetable.Client)(nil)

// messages is a slog handler that keeps every message with its level.
type messages struct {
	mu  sync.Mutex
	got []string
}

func (m *messages) Enabled(context.Context, slog.Level) bool { return true }
func (m *messages) Handle(_ context.Context, r slog.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.got = append(m.got, r.Level.String()+" "+r.Message)
	return nil
}
func (m *messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m *messages) WithGroup(string) slog.Handler      { return m }

func (m *messages) has(prefix string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.got {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

// startListener makes c open its LISTEN connection: a wait for a held
// lease, given up once the server shows the connection listening (a fixed
// short wait gave up too early when commits were slow).
func startListener(t *testing.T, ctx context.Context, holder, c *leasetable.Client) {
	t.Helper()
	l, err := holder.TryAcquire(ctx, "listen-starter")
	require.NoError(t, err)
	pool, err := holder.Pool()
	require.NoError(t, err)
	wait, cancel := context.WithCancel(ctx)
	defer cancel()
	waited := make(chan error, 1)
	go func() {
		_, err := c.Acquire(wait, "listen-starter")
		waited <- err
	}()
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		n := pgtest.Count(t, pool, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgbaton lease listener %' AND pid <> pg_backend_pid() AND datname = current_database()")
		return n > 0, nil
	}, "c never opened its LISTEN connection")
	cancel()
	require.ErrorIs(t, <-waited, context.Canceled)
	require.NoError(t, l.Release(ctx))
}

type allowKey struct{}

func TestCheckListenerLoss(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	// While blocked, the pool hands out connections only to callers whose
	// context carries allowKey (the test's Check calls): the listener
	// cannot reconnect, but the database still answers.
	var blocked atomic.Bool
	gated := pgtest.Pool(t, d.URL, func(cfg *pgxpool.Config) {
		cfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) {
			if blocked.Load() && ctx.Value(allowKey{}) == nil {
				return true, errors.New("test: connections blocked")
			}
			return true, nil
		}
	})
	logs := &messages{}
	c := newClient(t, gated, leasetable.Config{Owner: "checked", TTL: time.Minute, Logger: slog.New(logs)})
	holder := newClient(t, pool, leasetable.Config{Owner: "holder", TTL: time.Minute})
	checkCtx := context.WithValue(ctx, allowKey{}, true)
	require.NoError(t, c.Check(checkCtx), "no LISTEN connection yet: nothing to check")
	startListener(t, ctx, holder, c)
	// A waiter throughout: a client with none stops listening, and then
	// has nothing to check.
	pinned, err := holder.TryAcquire(ctx, "pinned")
	require.NoError(t, err)
	waitCtx, stopWaiting := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := c.Acquire(waitCtx, "pinned")
		waited <- err
	}()
	defer func() {
		stopWaiting()
		<-waited
		_ = pinned.Release(ctx)
	}()
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		return leasetable.ListenerWaiters(c) > 0, nil
	}, "the waiter never subscribed")
	// The connection may still be coming up (the waiter polls meanwhile).
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		return c.Check(checkCtx) == nil, nil
	}, "a notification does not make the round trip")

	blocked.Store(true)
	var pid uint32
	require.NoError(t, pool.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'pgbaton lease listener %' AND pid <> pg_backend_pid() AND datname = current_database()").Scan(&pid))
	env.Terminate(t, pid)
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		err := c.Check(checkCtx)
		return err != nil && strings.Contains(err.Error(), "LISTEN connection down"), nil
	}, "Check did not report the lost LISTEN connection")
	assert.True(t, logs.has("WARN pgbaton: lease LISTEN connection failed; reconnecting"))

	blocked.Store(false)
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		return c.Check(checkCtx) == nil, nil
	}, "Check did not recover after the LISTEN connection came back")
	assert.True(t, logs.has("INFO pgbaton: lease LISTEN connection re-established"))

	require.NoError(t, c.Close(ctx))
	require.ErrorIs(t, c.Check(ctx), pgbaton.ErrClosed)
}

func TestCheckStalledRenewal(t *testing.T) {
	if env.Cluster() == nil {
		t.Skip("needs the throwaway cluster") // only with PGBATON_TEST_DSN
	}
	d := env.DB(t)
	proxied, proxy := env.ProxiedPool(t, d)
	ctx := pgtest.Context(t, time.Minute)
	c := newClient(t, proxied, leasetable.Config{Owner: "stalled", TTL: 4 * time.Second, RenewInterval: 300 * time.Millisecond})
	l, err := c.TryAcquire(ctx, "slow")
	require.NoError(t, err)
	require.NoError(t, c.Check(ctx))

	proxy.Stall()
	defer proxy.Resume()
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		err := c.Check(cctx)
		return err != nil && strings.Contains(err.Error(), `overdue for renewal`) &&
			strings.Contains(err.Error(), `"slow"`) && strings.Contains(err.Error(), "database did not answer"), nil
	}, "Check did not report the stalled renewal")
	require.NoError(t, l.Err(), "reported before the lease is lost")

	proxy.Resume()
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		return c.Check(ctx) == nil, nil
	}, "Check did not recover after the network came back")
}
