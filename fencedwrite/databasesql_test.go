package fencedwrite_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/databasesql"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/faultproxy"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// sqlRows counts the rows of t through db.
func sqlRows(t *testing.T, ctx context.Context, db *sql.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT count(*) FROM t").Scan(&n))
	return n
}

// In a *sql.Tx, Guard, SetToken, the value helpers and MarkProcessed do
// what they do in a pgx.Tx, and a stale token aborts the transaction.
func TestDatabaseSQLTransaction(t *testing.T) {
	ctx := testContext(t)
	d := env.DB(t)
	pool, sdb := d.Pool(t), d.SQLDB(t)
	_, err := sdb.ExecContext(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	token := acquire(t, ctx, pool, "job:a", "me", time.Minute)

	tx, err := sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	wtx := databasesql.Wrap(tx)
	require.NoError(t, fencedwrite.Guard(ctx, wtx, "job:a", token))
	require.NoError(t, fencedwrite.SetToken(ctx, wtx, token))
	v, err := fencedwrite.PutValue(ctx, databasesql.WrapQuerier(tx), "cursor", token, json.RawMessage(`{"at": 1}`))
	require.NoError(t, err)
	require.Equal(t, token, v.Token)
	require.JSONEq(t, `{"at": 1}`, string(v.Data))
	require.NoError(t, fencedwrite.MarkProcessed(ctx, wtx, "billing", "m1"))
	_, err = tx.ExecContext(ctx, "INSERT INTO t VALUES (1)")
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	// Outside a transaction, on the *sql.DB: reads, and their errors.
	q := databasesql.WrapQuerier(sdb)
	got, err := fencedwrite.GetValue(ctx, q, "cursor")
	require.NoError(t, err)
	require.Equal(t, token, got.Token)
	_, err = fencedwrite.GetValue(ctx, q, "none")
	require.ErrorIs(t, err, fencedwrite.ErrNotFound)
	_, err = fencedwrite.PutValue(ctx, q, "cursor", token+1, json.RawMessage(`{"at": 2}`))
	require.NoError(t, err)
	_, err = fencedwrite.PutValue(ctx, q, "cursor", token, json.RawMessage(`{"at": 0}`))
	requireStale(t, err, "cursor", token, token+1, "older than the value's")

	// A repeat is refused, and aborts its transaction.
	tx, err = sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	err = fencedwrite.MarkProcessed(ctx, databasesql.Wrap(tx), "billing", "m1")
	require.ErrorIs(t, err, fencedwrite.ErrAlreadyProcessed)
	require.NoError(t, tx.Rollback())

	// Another holder takes the lease over: the old token's guard fails
	// with the details, and the transaction can commit nothing.
	_, err = pool.Exec(ctx, "SELECT pgbaton.release('job:a', 'me', $1)", token)
	require.NoError(t, err)
	newer := acquire(t, ctx, pool, "job:a", "other", time.Minute)
	tx, err = sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	err = fencedwrite.Guard(ctx, databasesql.Wrap(tx), "job:a", token)
	requireStale(t, err, "job:a", token, newer, "superseded")
	_, err = tx.ExecContext(ctx, "INSERT INTO t VALUES (2)")
	require.Error(t, err, "the transaction is aborted")
	require.Error(t, tx.Commit())
	require.Equal(t, 1, sqlRows(t, ctx, sdb))
}

func TestDatabaseSQLBadInput(t *testing.T) {
	ctx := testContext(t)
	sdb := env.DB(t).SQLDB(t)
	lease := fencedwrite.Token("job:a", 1)
	fn := func(*sql.Tx) error { return nil }
	for name, err := range map[string]error{
		"Guard":         fencedwrite.Guard(ctx, databasesql.Wrap(nil), "job:a", 1),
		"MarkProcessed": fencedwrite.MarkProcessed(ctx, databasesql.Wrap(nil), "c", "m"),
		"SetToken":      fencedwrite.SetToken(ctx, databasesql.Wrap(nil), 1),
		"InSQLTx db":    fencedwrite.InSQLTx(ctx, nil, lease, fn),
		"InSQLTx lease": fencedwrite.InSQLTx(ctx, sdb, nil, fn),
		"InSQLTx fn":    fencedwrite.InSQLTx(ctx, sdb, lease, nil),
		"InSQLTx token": fencedwrite.InSQLTx(ctx, sdb, fencedwrite.Token("job:a", 0), fn),
	} {
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, name)
	}
	_, err := fencedwrite.GetValue(ctx, databasesql.WrapQuerier(nil), "k")
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	var nilDB *sql.DB
	_, err = fencedwrite.GetValue(ctx, databasesql.WrapQuerier(nilDB), "k")
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
}

func TestInSQLTx(t *testing.T) {
	ctx := testContext(t)
	d := env.DB(t)
	pool, sdb := d.Pool(t), d.SQLDB(t)
	_, err := sdb.ExecContext(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	lease := fencedwrite.Token("job:a", acquire(t, ctx, pool, "job:a", "me", time.Minute))

	require.NoError(t, fencedwrite.InSQLTx(ctx, sdb, lease, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO t VALUES (1)")
		return err
	}))
	require.Equal(t, 1, sqlRows(t, ctx, sdb))

	boom := errors.New("boom")
	err = fencedwrite.InSQLTx(ctx, sdb, lease, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "INSERT INTO t VALUES (2)"); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Equal(t, 1, sqlRows(t, ctx, sdb))

	// A statement of fn that asserts a stale token is mapped.
	err = fencedwrite.InSQLTx(ctx, sdb, lease, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO t SELECT 3 WHERE pgbaton.assert_token('job:a', $1)", lease.Token()+100)
		return err
	})
	requireStale(t, err, "job:a", lease.Token()+100, lease.Token(), "not granted")

	_, err = pool.Exec(ctx, "SELECT pgbaton.release($1, $2, $3)", "job:a", "me", lease.Token())
	require.NoError(t, err)
	err = fencedwrite.InSQLTx(ctx, sdb, lease, func(*sql.Tx) error { t.Error("fn ran under a stale token"); return nil })
	requireStale(t, err, "job:a", lease.Token(), lease.Token(), "released")
	require.Equal(t, 1, sqlRows(t, ctx, sdb))
	require.Zero(t, sdb.Stats().InUse, "no connection left in use")
}

// commitReplyLost runs InSQLTx through proxy and loses the reply of its
// COMMIT, which commits; lost runs once the commit is in the database and
// the reply held back, and InSQLTx's result is returned.
func commitReplyLost(t *testing.T, ctx context.Context, d *pgtest.DB, lost func(*faultproxy.Proxy)) error {
	t.Helper()
	direct := d.SQLDB(t)
	proxied, proxy := env.ProxiedSQLDB(t, d)
	_, err := direct.ExecContext(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	lease := fencedwrite.Token("job:a", acquire(t, ctx, d.Pool(t), "job:a", "me", time.Minute))

	done := make(chan error, 1)
	go func() {
		done <- fencedwrite.InSQLTx(ctx, proxied, lease, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO t VALUES (1)")
			proxy.SetLatency(time.Second) // the COMMIT arrives late, its reply later still
			return err
		})
	}()
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		return sqlRows(t, ctx, direct) == 1, nil
	}, "the transaction did not commit")
	lost(proxy)
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("InSQLTx did not return")
		return nil
	}
}

// The COMMIT commits but its reply is lost: InSQLTx asks txid_status
// through another connection of the *sql.DB and answers nil.
func TestInSQLTxCommitReplyLost(t *testing.T) {
	ctx := testContext(t)
	err := commitReplyLost(t, ctx, env.DB(t), func(p *faultproxy.Proxy) {
		p.Cut()
		p.SetLatency(0)
	})
	require.NoError(t, err, "committed, though the reply was lost")
}

// The reply is lost and the database cannot be reached to ask: the answer
// is ErrCommitUnknown, never a guess.
func TestInSQLTxCommitUnknown(t *testing.T) {
	ctx := testContext(t)
	err := commitReplyLost(t, ctx, env.DB(t), func(p *faultproxy.Proxy) { _ = p.Close() })
	require.ErrorIs(t, err, fencedwrite.ErrCommitUnknown)
}
