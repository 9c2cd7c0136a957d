package fencedwrite_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/pgerr"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// A standby accepts the connection and the transaction but no write:
// every fenced write says so with pgbaton.ErrStandby, not with a bare
// SQLSTATE 25006 or a stale token.
func TestStandbyRefused(t *testing.T) {
	if env.Cluster() == nil {
		t.Skip("needs the throwaway cluster") // only with PGBATON_TEST_DSN
	}
	ctx := testContext(t)
	d := env.DB(t)
	primary := d.Pool(t)
	token := acquire(t, ctx, primary, "job:a", "me", time.Hour)
	_, err := primary.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY, fence_token bigint)")
	require.NoError(t, err)
	require.NoError(t, fencedwrite.EnableFencing(ctx, primary, pgx.Identifier{"t"}))
	// The base backup begins with a checkpoint; one done now leaves it
	// almost nothing to write.
	_, err = env.AdminPool().Exec(ctx, "CHECKPOINT")
	require.NoError(t, err)
	standby := pgtest.NewStandby(t, env.Cluster())
	pool := pgtest.Pool(t, standby.URL(d.Name))
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		return pool.Ping(ctx) == nil, nil
	}, "standby has no copy of %s", d.Name)

	refused := func(what string, err error) {
		t.Helper()
		require.ErrorIs(t, err, pgbaton.ErrStandby, what)
		require.NotErrorIs(t, err, fencedwrite.ErrStaleToken, what)
	}
	// PostgreSQL 13 does not report in_hot_standby, and the refused write
	// aborted the caller's transaction: the writes that learn of the
	// standby that way return PostgreSQL's own error there (see the
	// package doc), still never a stale token.
	refusedInTx := refused
	if pgtest.ServerVersion(t, pool) < 140000 {
		refusedInTx = func(what string, err error) {
			t.Helper()
			require.Equal(t, pgerr.ReadOnlyTransaction, pgerr.Code(err), what)
			require.NotErrorIs(t, err, fencedwrite.ErrStaleToken, what)
		}
	}
	inTx := func(fn func(tx pgx.Tx) error) error {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		return fn(tx)
	}
	lease := fencedwrite.Token("job:a", token)
	data := json.RawMessage(`1`)

	refused("Guard", inTx(func(tx pgx.Tx) error { return fencedwrite.Guard(ctx, tx, "job:a", token) }))
	refused("GuardLease", inTx(func(tx pgx.Tx) error { return fencedwrite.GuardLease(ctx, tx, lease) }))
	refused("InTx", fencedwrite.InTx(ctx, pool, lease, func(pgx.Tx) error { return nil }))
	_, err = fencedwrite.PutValue(ctx, pool, "k", token, data)
	refused("PutValue", err)
	refusedInTx("PutValue in a transaction", inTx(func(tx pgx.Tx) error {
		_, err := fencedwrite.PutValue(ctx, tx, "k", token, data)
		return err
	}))
	_, err = fencedwrite.CompareAndSwapValue(ctx, pool, "k", token, nil, data)
	refused("CompareAndSwapValue", err)
	refusedInTx("CompareAndSwapValue in a transaction", inTx(func(tx pgx.Tx) error {
		_, err := fencedwrite.CompareAndSwapValue(ctx, tx, "k", token, nil, data)
		return err
	}))
	refused("DeleteValue", fencedwrite.DeleteValue(ctx, pool, "k", token))
	refused("DisableFencing", fencedwrite.DisableFencing(ctx, pool, pgx.Identifier{"t"}))
	refusedInTx("BypassFencing", inTx(func(tx pgx.Tx) error {
		return fencedwrite.BypassFencing(ctx, tx, pgx.Identifier{"t"}, "why")
	}))
	refusedInTx("MarkProcessed", inTx(func(tx pgx.Tx) error { return fencedwrite.MarkProcessed(ctx, tx, "c", "m") }))
	_, err = fencedwrite.PruneProcessed(ctx, pool, fencedwrite.PruneConfig{})
	refused("PruneProcessed", err)

	// Reads are fine on a standby.
	_, err = fencedwrite.GetValue(ctx, pool, "k")
	require.ErrorIs(t, err, fencedwrite.ErrNotFound)
	require.Zero(t, pool.Stat().AcquiredConns(), "no connection left checked out")
}
