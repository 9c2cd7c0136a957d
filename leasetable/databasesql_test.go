package leasetable_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/databasesql"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// CompleteTx in a database/sql transaction: the effect and the completion
// commit together, and a lease taken over aborts the transaction.
func TestCompleteTxDatabaseSQL(t *testing.T) {
	d := env.DB(t)
	pool, sdb := d.Pool(t), d.SQLDB(t)
	ctx := pgtest.Context(t, 30*time.Second)
	_, err := pool.Exec(ctx, "CREATE TABLE effect (item text)")
	require.NoError(t, err)
	c := newClient(t, pool, leasetable.Config{Owner: "c", TTL: 2 * time.Second})
	other := newClient(t, pool, leasetable.Config{Owner: "other", TTL: 2 * time.Second})
	_, err = c.Register(ctx, "items", "a", "b")
	require.NoError(t, err)
	items, err := c.Claim(ctx, "items", 2)
	require.NoError(t, err)
	require.Len(t, items, 2)
	count := func(sql string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, sql).Scan(&n))
		return n
	}

	require.ErrorIs(t, c.CompleteTx(ctx, databasesql.Wrap(nil), items[0]), pgbaton.ErrInvalidArgument)

	tx, err := sdb.BeginTx(items[0].Context(), nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, "INSERT INTO effect VALUES ('a')")
	require.NoError(t, err)
	require.NoError(t, c.CompleteTx(ctx, databasesql.Wrap(tx), items[0]))
	require.NoError(t, tx.Commit())
	assert.Equal(t, 1, count("SELECT count(*) FROM effect WHERE item = 'a'"))
	assert.Zero(t, count("SELECT count(*) FROM pgbaton.lease WHERE name = 'a'"))
	select {
	case <-items[0].Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a lease completed in a database/sql transaction never ended")
	}
	assert.ErrorIs(t, items[0].Err(), leasetable.ErrReleased)

	_, err = pool.Exec(ctx, "SELECT pgbaton.force_release_lease('b', 'test')")
	require.NoError(t, err)
	taken, err := other.Claim(ctx, "items", 1)
	require.NoError(t, err)
	require.Len(t, taken, 1)
	tx, err = sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, "INSERT INTO effect VALUES ('b')")
	require.NoError(t, err)
	err = c.CompleteTx(ctx, databasesql.Wrap(tx), items[1])
	require.ErrorIs(t, err, leasetable.ErrNotHeld)
	require.Error(t, tx.Commit(), "the transaction is aborted")
	assert.Zero(t, count("SELECT count(*) FROM effect WHERE item = 'b'"))
	require.NoError(t, taken[0].Release(ctx))
}
