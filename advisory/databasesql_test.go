package advisory_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/databasesql"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// The XactLock family in a database/sql transaction: the lock excludes
// other transactions until commit, and a name is recorded in the caller's
// transaction (a query whose rows go through the adapter).
func TestXactLockDatabaseSQL(t *testing.T) {
	d := env.DB(t)
	pool, sdb := d.Pool(t), d.SQLDB(t)
	l := newLocker(t, pool, advisory.Config{})
	ctx := pgtest.Context(t, time.Minute)

	tx, err := sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	require.NoError(t, l.XactLock(ctx, databasesql.Wrap(tx), advisory.Name("sql:wait")))
	require.NoError(t, l.XactTryLock(ctx, databasesql.Wrap(tx), advisory.Int64(42)))

	other, err := sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.ErrorIs(t, l.XactTryLock(ctx, databasesql.Wrap(other), advisory.Name("sql:wait")), advisory.ErrLocked)
	require.ErrorIs(t, l.XactTryRLock(ctx, databasesql.Wrap(other), advisory.Int64(42)), advisory.ErrLocked)
	require.NoError(t, other.Rollback())

	require.NoError(t, tx.Commit())
	require.Equal(t, []string{"sql:wait"}, recordedNames(t, pool))
	other, err = sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, l.XactTryLock(ctx, databasesql.Wrap(other), advisory.Name("sql:wait")), "released at commit")
	require.NoError(t, other.Rollback())

	require.ErrorIs(t, l.XactLock(ctx, databasesql.Wrap(nil), advisory.Int64(1)), pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, l.XactLock(context.Background(), nil, advisory.Int64(1)), pgbaton.ErrInvalidArgument)
}
