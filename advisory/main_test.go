package advisory_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{Children: map[string]pgtest.ChildFunc{
		"hold":    childHold,
		"rawhold": childRawHold,
		"counter": childCounter,
		"watch":   childWatch,
	}})
	os.Exit(env.Run(m))
}

// childHold takes the lock named args[1] on the database at args[0],
// says "locked" and holds it until killed.
func childHold(ctx context.Context, args []string) error {
	pool, err := pgxpool.New(ctx, args[0])
	if err != nil {
		return err
	}
	l, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		return err
	}
	if _, err := l.Lock(ctx, advisory.Name(args[1])); err != nil {
		return err
	}
	pgtest.Printf("locked")
	select {}
}

// childRawHold is childHold on a raw pgx connection: the baseline of
// BenchmarkKillHandover.
func childRawHold(ctx context.Context, args []string) error {
	conn, err := pgx.Connect(ctx, args[0])
	if err != nil {
		return err
	}
	key, err := advisory.NameKey("", args[1])
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return err
	}
	pgtest.Printf("locked")
	select {}
}

// childWatch holds the lock named args[1] with short ping settings and
// reports when it is lost.
func childWatch(ctx context.Context, args []string) error {
	pool, err := pgxpool.New(ctx, args[0])
	if err != nil {
		return err
	}
	l, err := advisory.New(pool, advisory.Config{PingInterval: 50 * time.Millisecond, PingTimeout: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	lk, err := l.Lock(ctx, advisory.Name(args[1]))
	if err != nil {
		return err
	}
	pgtest.Printf("locked")
	<-lk.Done()
	pgtest.Printf("lost %v", lk.Err())
	select {}
}

// childCounter increments counter.n args[2] times, each time under the
// lock named args[1], with a read-modify-write that loses updates if two
// processes ever overlap.
func childCounter(ctx context.Context, args []string) error {
	pool, err := pgxpool.New(ctx, args[0])
	if err != nil {
		return err
	}
	defer pool.Close()
	l, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		return err
	}
	defer l.Close(ctx)
	n, _ := strconv.Atoi(args[2])
	pgtest.Printf("ready")
	for range n {
		err := l.RunExclusive(ctx, advisory.Name(args[1]), func(ctx context.Context) error {
			var v int
			if err := pool.QueryRow(ctx, "SELECT n FROM counter").Scan(&v); err != nil {
				return err
			}
			time.Sleep(200 * time.Microsecond) // widen the window a lost update needs
			_, err := pool.Exec(ctx, "UPDATE counter SET n = $1", v+1)
			return err
		}, advisory.RunOptions{Wait: true})
		if err != nil {
			return err
		}
	}
	pgtest.Printf("done")
	return nil
}

func newLocker(t testing.TB, pool *pgxpool.Pool, cfg advisory.Config) *advisory.Locker {
	t.Helper()
	l, err := advisory.New(pool, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, l.Close(ctx))
	})
	return l
}

// advisoryLocks counts granted advisory locks in database db, and waiting
// requests.
func advisoryLocks(t testing.TB, admin *pgxpool.Pool, d *pgtest.DB) (granted, waiting int) {
	t.Helper()
	err := admin.QueryRow(context.Background(), `
		SELECT count(*) FILTER (WHERE l.granted), count(*) FILTER (WHERE NOT l.granted)
		  FROM pg_locks l JOIN pg_database d ON d.oid = l.database
		 WHERE l.locktype = 'advisory' AND d.datname = $1`, d.Name).Scan(&granted, &waiting)
	require.NoError(t, err)
	return granted, waiting
}

// holderPID is the backend holding bigint key k.
func holderPID(t testing.TB, admin *pgxpool.Pool, d *pgtest.DB, k int64) uint32 {
	t.Helper()
	var pid int32
	err := admin.QueryRow(context.Background(), `
		SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database
		 WHERE l.locktype = 'advisory' AND l.granted AND d.datname = $1
		   AND l.objsubid = 1 AND l.classid::bigint = ($2::bigint >> 32) & x'ffffffff'::bigint
		   AND l.objid::bigint = $2::bigint & x'ffffffff'::bigint`, d.Name, k).Scan(&pid)
	require.NoError(t, err, "no holder of key %d", k)
	return uint32(pid)
}

func adminPool(t testing.TB) *pgxpool.Pool { return pgtest.Pool(t, env.AdminURL()) }

// eventuallyWaiting waits until n advisory lock requests wait in d.
func eventuallyWaiting(t testing.TB, admin *pgxpool.Pool, d *pgtest.DB, n int) {
	t.Helper()
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		_, w := advisoryLocks(t, admin, d)
		return w == n, nil
	}, "%d waiting advisory lock requests", n)
}

// handOver starts lock (a Locker's Lock or RLock) on key in a goroutine,
// waits until the server shows it waiting, unlocks held, and returns the
// lock the waiter was granted.
func handOver(t testing.TB, admin *pgxpool.Pool, d *pgtest.DB, held *advisory.Lock, lock func(context.Context, advisory.Key) (*advisory.Lock, error), key advisory.Key) *advisory.Lock {
	t.Helper()
	ctx := pgtest.Context(t, time.Minute)
	got := make(chan *advisory.Lock, 1)
	go func() {
		lk, err := lock(ctx, key)
		if err != nil {
			t.Error(err)
		}
		got <- lk
	}()
	eventuallyWaiting(t, admin, d, 1)
	require.NoError(t, held.Unlock(ctx))
	lk := <-got
	require.NotNil(t, lk)
	return lk
}

// databaseURL is a fresh migrated database for an example. The
// environment drops it at the end.
func databaseURL() string { return env.DB(exampleTB{}).URL }

// exampleTB lets examples, which have no *testing.T, use the harness.
type exampleTB struct{ testing.TB }

func (exampleTB) Helper()                      {}
func (exampleTB) Cleanup(func())               {}
func (exampleTB) Fatalf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
