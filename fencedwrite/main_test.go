package fencedwrite_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{Children: map[string]pgtest.ChildFunc{
		"counter": counterChild,
	}})
	os.Exit(env.Run(m))
}

// newPool opens a pool on a fresh migrated database, large enough for
// tests that hold several transactions open while they watch them.
func newPool(t *testing.T) *pgxpool.Pool {
	return env.DB(t).Pool(t, func(c *pgxpool.Config) { c.MaxConns = 16 })
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// acquire grants lease name to owner for ttl through the leasetable SQL
// protocol and returns the token.
func acquire(t *testing.T, ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, name, owner string, ttl time.Duration) int64 {
	t.Helper()
	var token int64
	err := q.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire($1, $2, $3)", name, owner, ttl.Milliseconds()).Scan(&token)
	require.NoError(t, err, "acquire %s for %s", name, owner)
	return token
}

// waitExpired polls, without locking anything, until lease name has
// expired by the database clock.
func waitExpired(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string) {
	t.Helper()
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		var expired bool
		err := pool.QueryRow(ctx, "SELECT expires_at <= clock_timestamp() FROM pgbaton.lease WHERE name = $1", name).Scan(&expired)
		return expired, err
	}, "lease %s did not expire", name)
}

// requireUnlocked fails unless lease name's row can be locked at once and
// no connection of pool is left checked out: a failed guarded write left
// nothing behind.
func requireUnlocked(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string) {
	t.Helper()
	require.Zero(t, pool.Stat().AcquiredConns(), "connections left checked out")
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT FROM pgbaton.lease WHERE name = $1 FOR UPDATE NOWAIT", name)
		return err
	})
	require.NoError(t, err, "lease row %s is still locked", name)
}

// waitBlocked waits until backend pid is waiting for a lock.
func waitBlocked(t *testing.T, ctx context.Context, pool *pgxpool.Pool, pid uint32) {
	t.Helper()
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		var waiting bool
		err := pool.QueryRow(ctx, "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", int32(pid)).Scan(&waiting)
		return waiting, err
	}, "backend %d is not waiting for a lock", pid)
}

// async runs fn on a connection of its own and returns that connection's
// backend pid and a channel with fn's result.
func async[T any](t *testing.T, ctx context.Context, pool *pgxpool.Pool, fn func(*pgx.Conn) (T, error)) (uint32, <-chan result[T]) {
	t.Helper()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	c := conn.Conn()
	ch := make(chan result[T], 1)
	go func() {
		defer conn.Release()
		v, err := fn(c)
		ch <- result[T]{v, err}
	}()
	return c.PgConn().PID(), ch
}

type result[T any] struct {
	v   T
	err error
}

func receive[T any](t *testing.T, ch <-chan result[T]) (T, error) {
	t.Helper()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-time.After(30 * time.Second):
		t.Fatal("no result within 30s")
		panic("unreachable")
	}
}

// examplePool gives an Example function, which has no testing.T, a fresh
// migrated database; done drops it.
func examplePool() (*pgxpool.Pool, func()) { return env.ExamplePool() }
