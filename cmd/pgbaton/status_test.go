package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/migrations"
)

// A primary whose only standby is asynchronous: status says that grants
// acknowledged just before a failover can be lost; once the standby is
// synchronous it does not.
func TestStatusWarnsAboutAsynchronousStandbys(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary := pgtest.NewCluster(t, pgcluster.Config{Settings: map[string]string{"fsync": "off"}})
	url := primary.URL("postgres")
	require.NoError(t, migrations.UpURL(ctx, url))
	rep := statusJSON(t, url)
	require.Zero(t, rep.Standbys)
	require.Empty(t, rep.Warnings)

	pgtest.NewStandby(t, primary)
	pgtest.Eventually(t, time.Minute, func() (bool, error) {
		rep = statusJSON(t, url)
		return rep.Standbys == 1, nil
	}, "the standby does not show")
	require.Zero(t, rep.SyncStandbys)
	require.Len(t, rep.Warnings, 1)
	require.Contains(t, rep.Warnings[0], "none is synchronous")
	code, out, errOut := cli(t, "status", "--dsn", url)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "1 standby, 0 synchronous")

	pool := pgtest.Pool(t, url)
	_, err := pool.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '*'")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "SELECT pg_reload_conf()")
	require.NoError(t, err)
	pgtest.Eventually(t, time.Minute, func() (bool, error) {
		rep = statusJSON(t, url)
		return rep.SyncStandbys == 1, nil
	}, "the standby did not become synchronous")
	require.Empty(t, rep.Warnings)
}

// After a timeline change (the stored one cleared, as a restore into
// another cluster would look), status shows the failover grace: not
// started until the new timeline is stored, then until when and why.
func TestStatusShowsFailoverGrace(t *testing.T) {
	ctx := context.Background()
	db := env.DB(t)
	pool := pgtest.Pool(t, db.URL)
	for _, sql := range []string{
		`SELECT pgbaton.try_acquire('lease:a', 'worker-1', 60000)`,
		`UPDATE pgbaton.token_epoch SET timeline = NULL`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	rep := statusJSON(t, db.URL)
	require.True(t, rep.FailoverGrace.Active)
	require.True(t, rep.FailoverGrace.StartedAt.IsZero(), "not stored yet")
	_, err := pool.Exec(ctx, `SELECT pgbaton.sync_epoch()`)
	require.NoError(t, err)
	rep = statusJSON(t, db.URL)
	require.True(t, rep.FailoverGrace.Active)
	require.Equal(t, time.Minute, rep.FailoverGrace.LongestTTL)
	require.Greater(t, rep.FailoverGrace.Remaining, 50*time.Second)
	require.NotEmpty(t, rep.Warnings)
	code, out, errOut := cli(t, "status", "--dsn", db.URL)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "holding every grant back for")
}
