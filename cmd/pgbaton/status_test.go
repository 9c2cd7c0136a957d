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
