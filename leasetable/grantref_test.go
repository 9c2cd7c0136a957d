package leasetable_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// TestGrantRefLookupsReadOnlyTheirRows: release_ref (a grant whose caller
// gave up) and a claim sent again (its reply was lost) find a request's
// grants by grant_ref. Without an index on it they read every lease of the
// session: with 100,000 leases kept by one session, each such call read
// 100,000 rows. Counted with the backend's own statistics
// (pg_stat_xact_user_tables, before and after the call), which need no
// flush on any server version.
func TestGrantRefLookupsReadOnlyTheirRows(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pool := env.DB(t).Pool(t)
	const many = 3000
	names := make([]string, many+2)
	for i := range names {
		names[i] = fmt.Sprintf("item-%05d", i)
	}
	_, err := pool.Exec(ctx, "SELECT pgbaton.register('g', $1)", names)
	require.NoError(t, err)
	var session int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT id FROM pgbaton.session_open('w', 60000)").Scan(&session))
	claim := "SELECT count(*) FROM pgbaton.claim('g', 'w', $1, 60000, $2, $3::uuid, $4)"
	var n int
	require.NoError(t, pool.QueryRow(ctx, claim, many, session, "00000000-0000-4000-8000-000000000001", false).Scan(&n))
	require.Equal(t, many, n)
	const ref = "00000000-0000-4000-8000-000000000002"
	require.NoError(t, pool.QueryRow(ctx, claim, 2, session, ref, false).Scan(&n))
	require.Equal(t, 2, n)

	// rowsRead runs stmt in a transaction and returns how many rows of
	// pgbaton.lease it read, by index or by scan.
	rowsRead := func(stmt string, args ...any) (rows int64, result int) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		counted := func() (n int64) {
			require.NoError(t, tx.QueryRow(ctx, `
				SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
				  FROM pg_stat_xact_user_tables WHERE relid = 'pgbaton.lease'::regclass`).Scan(&n))
			return n
		}
		before := counted()
		require.NoError(t, tx.QueryRow(ctx, stmt, args...).Scan(&result))
		return counted() - before, result
	}
	read, got := rowsRead(claim, 2, session, ref, true)
	require.Equal(t, 2, got, "the claim sent again returns what the first one got")
	require.Less(t, read, int64(100), "a claim sent again read %d lease rows to find its 2 grants", read)
	read, got = rowsRead("SELECT count(*) FROM pgbaton.release_ref('w', $1, $2::uuid)", session, ref)
	require.Equal(t, 2, got, "release_ref gives back the request's 2 grants")
	require.Less(t, read, int64(100), "release_ref read %d lease rows to find its 2 grants", read)
}
