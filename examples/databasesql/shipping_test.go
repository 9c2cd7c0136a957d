package shipping_test

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // driver "postgres"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/databasesql"
	shipping "github.com/pgbaton/pgbaton/examples/databasesql"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{})
	os.Exit(env.Run(m))
}

// shipFunc runs the example's unit of work through one stack.
type shipFunc func(context.Context, *shipping.Worker, *leasetable.Lease, shipping.Message) error

// stack is one database/sql stack: open gives the unit of work through it
// on d, and the *sql.DB underneath.
type stack struct {
	name string
	open func(t *testing.T, d *pgtest.DB) (shipFunc, *sql.DB)
}

var stacks = []stack{
	{"GORM", func(t *testing.T, d *pgtest.DB) (shipFunc, *sql.DB) {
		sdb := d.SQLDB(t) // pgx's stdlib, as gorm.io/driver/postgres opens it
		gdb, err := gorm.Open(postgres.New(postgres.Config{Conn: sdb}), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		return func(ctx context.Context, w *shipping.Worker, item *leasetable.Lease, msg shipping.Message) error {
			return w.ShipGORM(ctx, gdb, item, msg)
		}, sdb
	}},
	{"sqlx pgx", func(t *testing.T, d *pgtest.DB) (shipFunc, *sql.DB) {
		xdb := sqlx.NewDb(d.SQLDB(t), "pgx")
		return func(ctx context.Context, w *shipping.Worker, item *leasetable.Lease, msg shipping.Message) error {
			return w.ShipSQLX(ctx, xdb, item, msg)
		}, xdb.DB
	}},
	{"sqlx lib/pq", func(t *testing.T, d *pgtest.DB) (shipFunc, *sql.DB) {
		xdb, err := sqlx.Open("postgres", d.URL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = xdb.Close() })
		return func(ctx context.Context, w *shipping.Worker, item *leasetable.Lease, msg shipping.Message) error {
			return w.ShipSQLX(ctx, xdb, item, msg)
		}, xdb.DB
	}},
}

// worker makes the example's Worker on d. pgbaton's locker and lease
// client run on a pgx pool of their own; the writes run in the stack's
// transactions.
func worker(t *testing.T, d *pgtest.DB, owner string) *shipping.Worker {
	t.Helper()
	pool := d.Pool(t)
	locker, err := advisory.New(pool, advisory.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Close(context.Background()) })
	c, err := leasetable.New(context.Background(), pool, leasetable.Config{Owner: owner, TTL: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return &shipping.Worker{Locker: locker, Leases: c}
}

func count(t *testing.T, ctx context.Context, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRowContext(ctx, query, args...).Scan(&n))
	return n
}

// claim registers order name and claims it for w.
func claim(t *testing.T, ctx context.Context, w *shipping.Worker, name string) *leasetable.Lease {
	t.Helper()
	_, err := w.Leases.Register(ctx, "orders:"+name, name)
	require.NoError(t, err)
	items, err := w.Leases.Claim(ctx, "orders:"+name, 1)
	require.NoError(t, err)
	require.Len(t, items, 1)
	return items[0]
}

// Each stack runs the whole flow in its own transactions: the shipment,
// its fenced cursor and the item's completion commit together; a message
// delivered twice is shipped once; a worker whose lease was taken over
// writes nothing; the order's transaction lock makes a second writer wait.
func TestStacks(t *testing.T) {
	for _, s := range stacks {
		t.Run(s.name, func(t *testing.T) {
			ctx := pgtest.Context(t, time.Minute)
			d := env.DB(t)
			ship, db := s.open(t, d)
			_, err := db.ExecContext(ctx, shipping.Schema)
			require.NoError(t, err)
			w := worker(t, d, "worker")
			shipments := func(order string) int {
				return count(t, ctx, db, "SELECT count(*) FROM shipment WHERE order_id = $1", order)
			}

			// Shipped: row, cursor and completion in one commit.
			o1 := claim(t, ctx, w, "o1")
			require.NoError(t, ship(ctx, w, o1, shipping.Message{ID: "m1", Carrier: "ups"}))
			assert.Equal(t, 1, count(t, ctx, db, "SELECT count(*) FROM shipment WHERE order_id = 'o1' AND token = $1", o1.Token()))
			assert.Zero(t, count(t, ctx, db, "SELECT count(*) FROM pgbaton.lease WHERE name = 'o1'"), "completed in the same commit")
			v, err := fencedwrite.GetValue(ctx, databasesql.WrapQuerier(db), shipping.Cursor)
			require.NoError(t, err)
			assert.JSONEq(t, `{"last": "o1"}`, string(v.Data))
			assert.Equal(t, o1.Token(), v.Token)

			// The same message again (for another order): refused, nothing
			// written, the item not completed.
			o2 := claim(t, ctx, w, "o2")
			err = ship(ctx, w, o2, shipping.Message{ID: "m1", Carrier: "ups"})
			require.ErrorIs(t, err, fencedwrite.ErrAlreadyProcessed)
			assert.Zero(t, shipments("o2"))
			require.NoError(t, o2.Err(), "still held")

			// o2's lease is taken over by another worker: the old holder's
			// write is refused as stale and writes nothing.
			_, err = db.ExecContext(ctx, "SELECT pgbaton.force_release_lease('o2', 'test')")
			require.NoError(t, err)
			other := worker(t, d, "other")
			taken, err := other.Leases.Claim(ctx, "orders:o2", 1)
			require.NoError(t, err)
			require.Len(t, taken, 1)
			err = ship(ctx, w, o2, shipping.Message{ID: "m2", Carrier: "dhl"})
			require.ErrorIs(t, err, fencedwrite.ErrStaleToken)
			assert.Zero(t, shipments("o2"))
			assert.Zero(t, count(t, ctx, db, "SELECT count(*) FROM pgbaton.processed_message WHERE message_id = 'm2'"),
				"the message's record rolled back with the rest: it comes again")

			// The new holder ships it; while another transaction holds the
			// order's lock, it waits for it.
			holder, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			require.NoError(t, other.Locker.XactLock(ctx, databasesql.Wrap(holder), advisory.Name("order:o2")))
			done := make(chan error, 1)
			go func() { done <- ship(ctx, other, taken[0], shipping.Message{ID: "m2", Carrier: "dhl"}) }()
			pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
				var n int
				err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&n)
				return n == 1, err
			}, "the second writer did not wait for the order's lock")
			require.NoError(t, holder.Commit())
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Fatal("the second writer did not finish")
			}
			assert.Equal(t, 1, shipments("o2"))
			assert.Equal(t, 1, count(t, ctx, db, "SELECT count(*) FROM pgbaton.processed_message WHERE message_id = 'm2'"))
		})
	}
}

// InSQLTx with the ORMs: fn's writes run on the *sql.Tx InSQLTx began.
func TestInSQLTx(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	d := env.DB(t)
	sdb := d.SQLDB(t)
	_, err := sdb.ExecContext(ctx, shipping.Schema)
	require.NoError(t, err)
	gdb, err := gorm.Open(postgres.New(postgres.Config{Conn: sdb}), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	w := worker(t, d, "worker")
	lease, err := w.Leases.Acquire(ctx, "shipping:batch")
	require.NoError(t, err)

	err = fencedwrite.InSQLTx(ctx, sdb, lease, func(tx *sql.Tx) error {
		g := gdb.Session(&gorm.Session{Context: ctx})
		g.Statement.ConnPool = tx // GORM on InSQLTx's transaction
		return g.Create(&shipping.Shipment{OrderID: "g1", Carrier: "ups", Token: lease.Token()}).Error
	})
	require.NoError(t, err)

	xdb := sqlx.NewDb(sdb, "pgx")
	err = fencedwrite.InSQLTx(ctx, xdb.DB, lease, func(tx *sql.Tx) error {
		// sqlx on a *sql.Tx it did not begin: bind with the *sqlx.DB,
		// run on the transaction.
		query, args, err := xdb.BindNamed(`INSERT INTO shipment VALUES (:order_id, :carrier, :token)`,
			shipping.Shipment{OrderID: "x1", Carrier: "dhl", Token: lease.Token()})
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, query, args...)
		return err
	})
	require.NoError(t, err)
	assert.Equal(t, 2, count(t, ctx, sdb, "SELECT count(*) FROM shipment"))

	require.NoError(t, lease.Release(ctx))
	err = fencedwrite.InSQLTx(ctx, sdb, lease, func(tx *sql.Tx) error {
		t.Error("fn ran under a released lease")
		return nil
	})
	require.ErrorIs(t, err, fencedwrite.ErrStaleToken)
}
