package test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// A connection to a standby stays open when the standby is promoted. If
// it asked for the timeline while in recovery, pgbaton.insert_timeline
// remembered "not readable" for the session and, once promoted, kept
// answering NULL: next_token then never raised the epoch on that
// connection, and tokens drawn there could repeat the old timeline's.
// Only a refusal that lasts (the role may not read the WAL position, the
// server does not support it) is remembered; anything else is raised, so
// no token is drawn without knowing the timeline.
func TestTimelineIsReadAfterPromotionOnTheSameSession(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	primary := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true})
	url := newTokenDB(t, ctx, primary)
	var before int64
	pool := pgtest.Pool(t, url)
	require.NoError(t, pool.QueryRow(ctx, "SELECT pgbaton.insert_timeline()").Scan(&before))

	standby := pgtest.NewStandby(t, primary)
	conn, err := pgx.Connect(ctx, standby.URL("tokens"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	var tl *int64
	err = conn.QueryRow(ctx, "SELECT pgbaton.insert_timeline()").Scan(&tl)
	require.Error(t, err, "in recovery the timeline is not known yet: got %v", tl)

	_, err = conn.Exec(ctx, "SELECT pg_promote(true, 60)")
	require.NoError(t, err)
	require.NoError(t, conn.QueryRow(ctx, "SELECT pgbaton.insert_timeline()").Scan(&tl))
	require.NotNil(t, tl, "the promoted server's timeline, on the session that asked in recovery")
	require.Greater(t, *tl, before)
}

// The first token drawn on a new timeline does not lock the epoch row in
// the transaction that draws it: a caller of the SQL protocol that keeps
// that transaction open (here: a grant inside BEGIN, not yet committed)
// does not stall every other grant on the new primary. And a claim draws
// the epoch once, not once per granted row.
func TestNewTimelineGrantsDoNotWaitForEachOther(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	primary := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true})
	url := newTokenDB(t, ctx, primary)
	pool := pgtest.Pool(t, url)
	graceOff(t, ctx, pool) // the new primary grants at once
	var before int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire('old', 'o', 60000)").Scan(&before))
	_, err := pool.Exec(ctx, "SELECT pgbaton.register('items', ARRAY(SELECT 'i' || g FROM generate_series(1, 50) g))")
	require.NoError(t, err)
	standby := pgtest.NewStandby(t, primary)
	sb := pgtest.Pool(t, standby.URL("tokens"))
	_, err = sb.Exec(ctx, "SELECT pg_promote(true, 60)")
	require.NoError(t, err)

	open := pgtest.Connect(t, standby.URL("tokens"), "open-tx")
	tx, err := open.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var first int64
	require.NoError(t, tx.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire('a', 'o', 60000)").Scan(&first))
	require.Greater(t, first, before, "a token on the new timeline is larger")

	other := pgtest.Connect(t, standby.URL("tokens"), "other")
	_, err = other.Exec(ctx, "SET statement_timeout = '5s'")
	require.NoError(t, err)
	var second int64
	require.NoError(t, other.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire('b', 'o', 60000)").Scan(&second),
		"another grant waited for the open transaction")
	assert.Equal(t, first>>40, second>>40, "the same epoch")

	// A claim of 50 rows reads the timeline once.
	ctr, err := other.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = ctr.Rollback(ctx) }()
	_, err = ctr.Exec(ctx, "SET LOCAL track_functions = 'all'")
	require.NoError(t, err)
	var n int
	require.NoError(t, ctr.QueryRow(ctx, "SELECT count(*) FROM pgbaton.claim('items', 'o', 50, 60000)").Scan(&n))
	require.Equal(t, 50, n)
	var calls int64
	require.NoError(t, ctr.QueryRow(ctx, "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions WHERE schemaname = 'pgbaton' AND funcname = 'insert_timeline'").Scan(&calls))
	assert.EqualValues(t, 1, calls, "the timeline is read once per claim")
}
