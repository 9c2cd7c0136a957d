package test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// bouncerPool connects through PgBouncer the way an application behind a
// transaction pooler must: PgBouncer 1.18 keeps no prepared statements
// across transactions, so statements go out in the simple protocol.
func bouncerPool(t *testing.T, url string) *pgxpool.Pool {
	return pgtest.Pool(t, url, func(c *pgxpool.Config) {
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		c.MaxConns = 4
	})
}

// Behind PgBouncer in transaction pooling mode, session advisory locks
// would be taken and released on random backends: the Locker refuses them
// with ErrSessionPooling. Transaction-scoped locks, leases and fenced
// writes work.
func TestPgBouncerTransactionPooling(t *testing.T) {
	d := env.DB(t)
	url := pgtest.StartPgBouncer(t, d)
	ctx := pgtest.Context(t, 2*time.Minute)
	pool := bouncerPool(t, url)

	t.Run("session locks refused", func(t *testing.T) {
		refused := lockBehindBouncer(t, ctx, pool, url)
		require.ErrorIs(t, refused, advisory.ErrSessionPooling)
	})

	t.Run("xact locks work", func(t *testing.T) {
		locker, err := advisory.New(pool, advisory.Config{})
		require.NoError(t, err)
		defer locker.Close(ctx)
		key := advisory.Name("bouncer:xact")
		tx1, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, locker.XactTryLock(ctx, tx1, key))
		tx2, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.ErrorIs(t, locker.XactTryLock(ctx, tx2, key), advisory.ErrLocked)
		require.NoError(t, tx2.Rollback(ctx))
		require.NoError(t, tx1.Commit(ctx))
		tx3, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, locker.XactTryLock(ctx, tx3, key), "free again once the holding transaction ended")
		require.NoError(t, tx3.Commit(ctx))
	})

	t.Run("leases and fenced writes work", func(t *testing.T) {
		const ttl = 2 * time.Second
		a, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "bouncer-a", TTL: ttl})
		require.NoError(t, err)
		defer a.Close(ctx)
		b, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "bouncer-b", TTL: ttl})
		require.NoError(t, err)
		defer b.Close(ctx)
		la, err := a.TryAcquire(ctx, "bouncer:lease")
		require.NoError(t, err)
		_, err = b.TryAcquire(ctx, "bouncer:lease")
		require.ErrorIs(t, err, leasetable.ErrHeld)
		_, err = pool.Exec(ctx, "CREATE TABLE bouncer_ledger (token bigint)")
		require.NoError(t, err)
		require.NoError(t, fencedwrite.InTx(ctx, pool, la, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO bouncer_ledger VALUES ($1)", la.Token())
			return err
		}))
		// Renewals keep it past its TTL, through the pooler.
		time.Sleep(ttl + ttl/2) // the wait is the point: outlive one TTL
		require.NoError(t, la.Err())
		require.NoError(t, la.Release(ctx))
		start := time.Now()
		lb, err := b.Acquire(ctx, "bouncer:lease")
		require.NoError(t, err)
		assert.Less(t, time.Since(start), ttl, "released lease granted at once")
		assert.Greater(t, lb.Token(), la.Token())
		err = fencedwrite.InTx(ctx, pool, la, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO bouncer_ledger VALUES ($1)", la.Token())
			return err
		})
		require.ErrorIs(t, err, fencedwrite.ErrStaleToken)
		require.NoError(t, lb.Release(ctx))
	})
}

// lockBehindBouncer takes session locks through a transaction pooler until
// the Locker notices, and returns the refusal, with the Locker closed.
// Another client keeps a backend busy in a transaction, so consecutive
// statements of the Locker's session land on different backends, as they
// do in production under load.
func lockBehindBouncer(t *testing.T, ctx context.Context, pool *pgxpool.Pool, url string) error {
	busy := bouncerPool(t, url)
	tx, err := busy.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SELECT 1")
	require.NoError(t, err)

	locker, err := advisory.New(pool, advisory.Config{})
	require.NoError(t, err)
	defer locker.Close(ctx)
	var refused error
	for i := range 20 { // a pid change may take a few statements to show
		lk, err := locker.TryLock(ctx, advisory.Name(fmt.Sprintf("bouncer:%d", i)))
		if err != nil {
			refused = err
			break
		}
		select {
		case <-lk.Done():
			refused = lk.Err()
		case <-time.After(3 * time.Second): // a few pings
		}
		if refused != nil {
			break
		}
	}
	t.Logf("refused: %v", refused)
	require.NoError(t, locker.Close(ctx))
	return refused
}

// Behind PgBouncer in transaction mode no session lock may stay behind on
// the pooler's server connections, which outlive the client
// (server_lifetime, an hour by default) and would block every other client
// of those keys. Found by this suite: the Locker used to grant the first
// locks and notice the pooler only at a later ping, leaving them held;
// since advisory f08ff88 it probes before the first lock.
func TestPgBouncerRefusedSessionLeavesNoLocks(t *testing.T) {
	d := env.DB(t)
	url := pgtest.StartPgBouncer(t, d)
	ctx := pgtest.Context(t, 2*time.Minute)
	pool := bouncerPool(t, url)
	refused := lockBehindBouncer(t, ctx, pool, url)
	require.ErrorIs(t, refused, advisory.ErrSessionPooling)
	var left []string
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		rows, err := env.AdminPool().Query(ctx, `SELECT format('key %s pid %s', (classid::bigint << 32) | objid::bigint, pid)
			FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = $1)`, d.Name)
		if err != nil {
			return false, err
		}
		left, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return len(left) == 0, err
	}, "advisory locks left on backends behind PgBouncer after ErrSessionPooling and Close: %v", &left)
}

// bouncerCase is one PgBouncer setup the Locker must handle the same way
// every time.
type bouncerCase struct {
	name     string
	poolSize int
	simple   bool // the application's pool uses the simple protocol
	busy     bool // another client keeps one server connection in a transaction
	load     bool // other clients run statements through the pooler meanwhile
	prepared int  // PgBouncer's max_prepared_statements (1.21+); 0: off
}

// bouncerCases are the PgBouncer setups the tests run in, with its
// prepared statement support on as well where the installed PgBouncer
// has it (1.21 and later).
func bouncerCases(t *testing.T) []bouncerCase {
	cs := plainBouncerCases()
	if ok, version := pgtest.PgBouncerPreparedStatements(t); ok {
		for _, c := range plainBouncerCases() {
			c.name += " prepared statements on"
			c.prepared = 100
			cs = append(cs, c)
		}
	} else {
		t.Logf("%s has no prepared statement support (max_prepared_statements came in 1.21): the setups run with it off only", version)
	}
	return cs
}

func plainBouncerCases() []bouncerCase {
	var cs []bouncerCase
	for _, size := range []int{1, 4, 20} {
		for _, simple := range []bool{true, false} {
			for _, traffic := range []string{"quiet", "busy", "load"} {
				if size == 1 && traffic == "busy" {
					continue // the one server would be taken for good
				}
				cs = append(cs, bouncerCase{
					name:     fmt.Sprintf("pool %d %s %s", size, map[bool]string{true: "simple", false: "cached statements"}[simple], traffic),
					poolSize: size, simple: simple, busy: traffic == "busy", load: traffic == "load",
				})
			}
		}
	}
	return cs
}

// Behind PgBouncer in transaction mode every session lock is refused
// with ErrSessionPooling before any lock is taken, in every setup: pool
// sizes, protocol modes of the application's pool, quiet and loaded
// poolers. Several Lockers try the same keys at once: none may hold a key
// (not even two at once, which sharing one server connection would
// allow), and no lock may be left on a server connection.
func TestPgBouncerTransactionModeDeterministic(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, 5*time.Minute)
	admin := env.AdminPool()
	for _, c := range bouncerCases(t) {
		t.Run(c.name, func(t *testing.T) {
			url := pgtest.StartPgBouncerWith(t, d, pgtest.PgBouncerConfig{PoolMode: "transaction", PoolSize: c.poolSize, MaxPreparedStatements: c.prepared})
			newPool := func() *pgxpool.Pool {
				return pgtest.Pool(t, url, func(cfg *pgxpool.Config) {
					if c.simple {
						cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
					}
					cfg.MaxConns = 4
				})
			}
			if c.busy {
				tx, err := bouncerPool(t, url).Begin(ctx)
				require.NoError(t, err)
				t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
				_, err = tx.Exec(ctx, "SELECT 1")
				require.NoError(t, err)
			}
			stopLoad := func() {}
			if c.load {
				lctx, cancel := context.WithCancel(ctx)
				loadPool := bouncerPool(t, url)
				var wg sync.WaitGroup
				for range 3 {
					wg.Go(func() {
						for lctx.Err() == nil {
							_, _ = loadPool.Exec(lctx, "SELECT 1")
						}
					})
				}
				stopLoad = func() { cancel(); wg.Wait() }
				defer stopLoad()
			}
			const lockers = 3
			var wg sync.WaitGroup
			errs := make(chan error, lockers*10)
			for i := range lockers {
				pool := newPool()
				wg.Go(func() {
					l, err := advisory.New(pool, advisory.Config{})
					if err != nil {
						errs <- err
						return
					}
					defer l.Close(ctx)
					for j := range 4 {
						keys := []advisory.Key{advisory.Int64(int64(j)), advisory.Name(fmt.Sprintf("bouncer:%d", j))}
						for _, key := range keys {
							lk, err := l.TryLock(ctx, key)
							if err == nil {
								errs <- fmt.Errorf("locker %d took %s behind a transaction pooler", i, key)
								_ = lk.Unlock(ctx)
								continue
							}
							errs <- err
						}
					}
					wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					defer cancel()
					if lk, err := l.Lock(wctx, advisory.Int64(99)); err == nil {
						errs <- fmt.Errorf("locker %d waited for and took 99 behind a transaction pooler", i)
						_ = lk.Unlock(ctx)
					} else {
						errs <- err
					}
				})
			}
			wg.Wait()
			stopLoad()
			close(errs)
			for err := range errs {
				require.ErrorIs(t, err, advisory.ErrSessionPooling)
			}
			left := advisoryLocksIn(t, ctx, admin, d.Name)
			require.Empty(t, left, "advisory locks left on server connections behind PgBouncer")
		})
	}
}

// advisoryLocksIn lists the advisory locks held or awaited in database db.
func advisoryLocksIn(t *testing.T, ctx context.Context, admin *pgxpool.Pool, db string) []string {
	rows, err := admin.Query(ctx, `SELECT format('key %s pid %s %s', (classid::bigint << 32) | objid::bigint, pid, CASE WHEN granted THEN 'held' ELSE 'waiting' END)
		FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = $1)`, db)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return left
}

// Behind PgBouncer in session mode a client connection keeps its server
// connection, so session locks work: exclusion, waits, loss when the
// server connection is terminated, and nothing left after Close (PgBouncer
// resets the server connection with DISCARD ALL, which also releases
// advisory locks, when a client leaves).
func TestPgBouncerSessionModeWorks(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, 2*time.Minute)
	admin := env.AdminPool()
	var cases []bouncerCase
	for _, c := range bouncerCases(t) {
		if c.poolSize == 4 && !c.busy && !c.load {
			cases = append(cases, c)
		}
	}
	for _, c := range cases {
		simple := c.simple
		t.Run(c.name, func(t *testing.T) {
			url := pgtest.StartPgBouncerWith(t, d, pgtest.PgBouncerConfig{PoolMode: "session", PoolSize: 10, MaxPreparedStatements: c.prepared})
			pool := pgtest.Pool(t, url, func(cfg *pgxpool.Config) {
				if simple {
					cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
				}
				cfg.MaxConns = 4
			})
			// A pooler cannot be told from outside to be in session mode:
			// it must be declared.
			undeclared, err := advisory.New(pool, advisory.Config{})
			require.NoError(t, err)
			_, err = undeclared.TryLock(ctx, advisory.Int64(1))
			require.ErrorIs(t, err, advisory.ErrSessionPooling)
			require.ErrorContains(t, err, "SessionPooler")
			require.NoError(t, undeclared.Close(ctx))

			a, err := advisory.New(pool, advisory.Config{SessionPooler: true})
			require.NoError(t, err)
			b, err := advisory.New(pool, advisory.Config{SessionPooler: true})
			require.NoError(t, err)
			key := advisory.Name("bouncer:session")
			lk, err := a.TryLock(ctx, key)
			require.NoError(t, err)
			_, err = b.TryLock(ctx, key)
			require.ErrorIs(t, err, advisory.ErrLocked)
			got := make(chan error, 1)
			go func() {
				lb, err := b.Lock(ctx, key)
				if err == nil {
					err = lb.Unlock(ctx)
				}
				got <- err
			}()
			pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
				for _, l := range advisoryLocksIn(t, ctx, admin, d.Name) {
					if strings.HasSuffix(l, " waiting") {
						return true, nil
					}
				}
				return false, nil
			}, "b waits")
			require.NoError(t, lk.Unlock(ctx))
			require.NoError(t, <-got)
			require.NoError(t, a.Close(ctx))
			require.NoError(t, b.Close(ctx))
			require.Empty(t, advisoryLocksIn(t, ctx, admin, d.Name))
		})
	}
}
