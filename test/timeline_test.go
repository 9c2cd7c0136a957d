package test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
