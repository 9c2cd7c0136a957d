package pgtest

import (
	"context"
	"sync"
	"testing"
	"time"

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

// BlockKeepalives makes the keep-alives of owner's sessions (its
// pgbaton.lease_session rows) hang behind a row lock until unblock is
// called (or the test ends), so its leases lapse. FOR NO KEY UPDATE, as a
// keep-alive's own update: grants, which hold the row FOR KEY SHARE
// (pgbaton.session_hold), still go through.
func BlockKeepalives(t testing.TB, pool *pgxpool.Pool, owner string) (unblock func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	// Named, so that a wait can tell a keep-alive blocked by this lock
	// from one held up for a moment by another's (KeepaliveBlocked).
	_, err = tx.Exec(ctx, "SELECT set_config('application_name', $1, true)", blockerName)
	require.NoError(t, err)
	var n int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM (SELECT 1 FROM pgbaton.lease_session WHERE owner = $1 FOR NO KEY UPDATE) s", owner).Scan(&n))
	require.Positive(t, n, "owner %s has no session", owner)
	var once sync.Once
	unblock = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	t.Cleanup(unblock)
	return unblock
}

const blockerName = "pgtest.BlockKeepalives"

// KeepaliveBlocked reports whether a keep-alive waits for the row lock of
// BlockKeepalives: that lock, not any lock wait of a statement naming
// session_keepalive (another client's keep-alive can wait a moment for a
// row a third one inserts, and a keep-alive of the blocked owner can then
// still be on its way back with a success).
func KeepaliveBlocked(t testing.TB, pool *pgxpool.Pool) bool {
	t.Helper()
	return Count(t, pool, `SELECT count(*) FROM pg_stat_activity a
		WHERE a.datname = current_database() AND a.wait_event_type = 'Lock' AND a.query LIKE '%session_keepalive%'
		  AND EXISTS (SELECT 1 FROM pg_stat_activity b
		               WHERE b.pid = ANY (pg_blocking_pids(a.pid)) AND b.application_name = $1)`, blockerName) > 0
}

// TableStats are a table's counters in pg_stat_user_tables.
type TableStats struct {
	SeqScan, IdxScan, Inserted, Updated, HotUpdated, Deleted int64
}

// WaitTableStats polls pg_stat_user_tables for table until ready says the
// counters include the work the test did, and returns them. A backend
// reports its counters when it exits, and otherwise when it likes (before
// PostgreSQL 15 at most every 500 ms, and pg_stat_force_next_flush is 15
// and later), so: do the work on a connection of its own, close it, and
// let ready wait for a count the work reaches exactly (rows inserted,
// updated or deleted by its last statement). A backend reports all of a
// table's counters at once, so the others are complete then too.
func WaitTableStats(t testing.TB, pool *pgxpool.Pool, table string, ready func(TableStats) bool) TableStats {
	t.Helper()
	var s TableStats
	Eventually(t, 30*time.Second, func() (bool, error) {
		err := pool.QueryRow(context.Background(), `
			SELECT seq_scan, coalesce(idx_scan, 0), n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
			  FROM pg_stat_user_tables WHERE relid = $1::regclass`, table).
			Scan(&s.SeqScan, &s.IdxScan, &s.Inserted, &s.Updated, &s.HotUpdated, &s.Deleted)
		return err == nil && ready(s), err
	}, "the statistics of %s never showed the work: last %+v", table, &s)
	return s
}

// ServerVersion returns the server's server_version_num (130023 for
// 13.23), for tests that check a guarantee differently on servers that
// lack a newer feature.
func ServerVersion(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	return Count(t, pool, "SELECT current_setting('server_version_num')::int")
}
