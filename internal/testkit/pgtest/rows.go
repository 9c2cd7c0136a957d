package pgtest

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Count runs sql, a query returning one integer, and returns it.
func Count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// BlockKeepalives makes the keep-alives of owner's lifelines (its
// pgbaton.lease_session rows) hang behind a row lock until unblock is
// called (or the test ends), so its leases lapse. FOR NO KEY UPDATE, as a
// keep-alive's own update: grants, which hold the row FOR KEY SHARE
// (pgbaton.session_hold), still go through.
func BlockKeepalives(t testing.TB, pool *pgxpool.Pool, owner string) (unblock func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	var n int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM (SELECT 1 FROM pgbaton.lease_session WHERE owner = $1 FOR NO KEY UPDATE) s", owner).Scan(&n))
	require.Positive(t, n, "owner %s has no lifeline", owner)
	var once sync.Once
	unblock = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	t.Cleanup(unblock)
	return unblock
}
