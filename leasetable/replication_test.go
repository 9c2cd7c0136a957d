package leasetable_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/migrations"
)

// A primary with an asynchronous standby: New logs a warning once, Check
// does not fail for it nor log it again, and Replication says why; once
// the standby is synchronous the warning clears, unless the sessions
// commit without waiting for it.
func TestReplicationWarning(t *testing.T) {
	ctx := pgtest.Context(t, 2*time.Minute)
	// synchronous_commit on (NoFsync would turn it off), fsync off for speed.
	primary := pgtest.NewCluster(t, pgcluster.Config{Settings: map[string]string{"fsync": "off"}})
	require.NoError(t, migrations.UpURL(ctx, primary.URL("postgres")))
	pool := pgtest.Pool(t, primary.URL("postgres"))

	// No standby: nothing to say.
	rs, err := leasetable.ReplicationOf(ctx, pool)
	require.NoError(t, err)
	assert.Equal(t, 0, rs.Standbys)
	require.NoError(t, rs.Err())

	pgtest.NewStandby(t, primary)
	pgtest.Eventually(t, time.Minute, func() (bool, error) {
		rs, err = leasetable.ReplicationOf(ctx, pool)
		return rs.Standbys == 1, err
	}, "the standby does not show in pg_stat_replication")
	assert.Equal(t, 0, rs.SyncStandbys)
	require.ErrorIs(t, rs.Err(), leasetable.ErrNoSyncStandby)

	var log pgtest.Log
	const warning = "acknowledged grants can be lost in a failover"
	c := newClient(t, pool, leasetable.Config{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	assert.Equal(t, 1, log.Count(warning), "New logs the warning")
	require.NoError(t, c.Check(ctx), "asynchronous standbys do not fail Check")
	require.NoError(t, c.Check(ctx))
	assert.Equal(t, 1, log.Count(warning), "Check logs the warning only when it changes")
	got, err := c.Replication(ctx)
	require.NoError(t, err)
	require.ErrorIs(t, got.Err(), leasetable.ErrNoSyncStandby)

	_, err = pool.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '*'")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "SELECT pg_reload_conf()")
	require.NoError(t, err)
	pgtest.Eventually(t, time.Minute, func() (bool, error) {
		rs, err = c.Replication(ctx)
		return rs.SyncStandbys == 1, err
	}, "the standby did not become synchronous")
	require.NoError(t, rs.Err())
	require.NoError(t, c.Check(ctx))
	assert.Equal(t, 1, log.Count("a synchronous standby protects acknowledged grants again"))

	// Sessions that do not wait for the synchronous standby.
	local := pgtest.Pool(t, primary.URL("postgres"), func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "local"
	})
	rs, err = leasetable.ReplicationOf(ctx, local)
	require.NoError(t, err)
	require.ErrorIs(t, rs.Err(), leasetable.ErrNoSyncStandby)
	assert.Contains(t, rs.Err().Error(), "synchronous_commit is local")

	_, err = leasetable.ReplicationOf(ctx, nil)
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	require.NoError(t, c.Close(ctx))
	_, err = c.Replication(ctx)
	require.ErrorIs(t, err, pgbaton.ErrClosed)
}
