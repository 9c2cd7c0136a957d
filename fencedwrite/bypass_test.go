package fencedwrite_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/fencedwrite"
)

// testRole creates a role for this test's database, allowed to write the
// accounts tables, in role inRole if not empty, and drops it afterwards.
func testRole(t *testing.T, ctx context.Context, pool *pgxpool.Pool, prefix, inRole string) string {
	t.Helper()
	role := env.Role(t, ctx, pool, prefix, inRole)
	_, err := pool.Exec(ctx, "GRANT SELECT, UPDATE, DELETE ON accounts, others TO "+pgx.Identifier{role}.Sanitize())
	require.NoError(t, err)
	return role
}

// An operator may write a fenced table without a token, for one table and
// one transaction, after saying why; the audit log records it. Nobody
// else can.
func TestOperatorBypass(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	fencedTable(t, ctx, pool) // row 1: balance 100, token 7
	_, err := pool.Exec(ctx, "CREATE TABLE others (id int PRIMARY KEY, fence_token bigint); INSERT INTO others VALUES (1, 7)")
	require.NoError(t, err)
	require.NoError(t, fencedwrite.EnableFencing(ctx, pool, pgx.Identifier{"others"}))
	app := testRole(t, ctx, pool, "app", "")
	admin := testRole(t, ctx, pool, "admin", "pgbaton_admin")
	as := func(role string, fn func(tx pgx.Tx) error) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
				return err
			}
			return fn(tx)
		})
	}
	exec := func(tx pgx.Tx, sql string) error {
		_, err := tx.Exec(ctx, sql)
		return err
	}

	// Not an admin: refused, and setting the bypass by hand does nothing.
	err = as(app, func(tx pgx.Tx) error { return exec(tx, "SELECT pgbaton.bypass_fencing('accounts', 'fix')") })
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code)
	err = as(app, func(tx pgx.Tx) error {
		return exec(tx, "SET LOCAL pgbaton.fence_bypass = '1'; UPDATE accounts SET balance = 0 WHERE id = 1")
	})
	requireStale(t, fencedwrite.MapError(err), "public.accounts", 0, 7, "no token")
	err = as(admin, func(tx pgx.Tx) error {
		return exec(tx, "SET LOCAL pgbaton.fence_bypass = '1'; UPDATE accounts SET balance = 0 WHERE id = 1")
	})
	requireStale(t, fencedwrite.MapError(err), "public.accounts", 0, 7, "no token")
	// An admin without a reason: bad input.
	err = as(admin, func(tx pgx.Tx) error { return exec(tx, "SELECT pgbaton.bypass_fencing('accounts', ' ')") })
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22023", pgErr.Code)

	// An admin with a reason writes that table without a token, and only
	// that table; the rows keep their tokens.
	err = as(admin, func(tx pgx.Tx) error {
		if err := exec(tx, "SELECT pgbaton.bypass_fencing('accounts', 'ticket 42: wrong balance')"); err != nil {
			return err
		}
		if err := exec(tx, "UPDATE accounts SET balance = 42 WHERE id = 1"); err != nil {
			return err
		}
		return exec(tx, "UPDATE others SET id = 2 WHERE id = 1")
	})
	requireStale(t, fencedwrite.MapError(err), "public.others", 0, 7, "no token")
	err = as(admin, func(tx pgx.Tx) error {
		if err := fencedwrite.BypassFencing(ctx, tx, pgx.Identifier{"accounts"}, "ticket 42: wrong balance"); err != nil {
			return err
		}
		return exec(tx, "UPDATE accounts SET balance = 42 WHERE id = 1")
	})
	require.NoError(t, err)
	b, tok := balance(t, ctx, pool)
	require.Equal(t, 42, b)
	require.Equal(t, int64(7), tok)

	var actor, target, reason string
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) OVER (), actor, target, reason FROM pgbaton.event
		WHERE action = 'bypass_fencing' ORDER BY id DESC LIMIT 1`).Scan(&n, &actor, &target, &reason))
	require.Equal(t, 1, n, "the rolled back bypass left no event")
	require.Equal(t, []string{admin, "accounts", "ticket 42: wrong balance"}, []string{actor, target, reason})

	// The bypass ended with its transaction.
	err = as(admin, func(tx pgx.Tx) error { return exec(tx, "DELETE FROM accounts WHERE id = 1") })
	requireStale(t, fencedwrite.MapError(err), "public.accounts", 0, 7, "no token")
}

func TestBypassFencingBadInput(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	fencedTable(t, ctx, pool)
	_, err := pool.Exec(ctx, "CREATE TABLE plain (id int)")
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)

	require.ErrorIs(t, fencedwrite.BypassFencing(ctx, nil, pgx.Identifier{"accounts"}, "why"), pgbaton.ErrInvalidArgument)
	for _, table := range []pgx.Identifier{nil, {""}, {"a", "b", "c", "d"}} {
		require.ErrorIs(t, fencedwrite.BypassFencing(ctx, tx, table, "why"), pgbaton.ErrInvalidArgument, "%q", table)
	}
	require.ErrorIs(t, fencedwrite.BypassFencing(ctx, tx, pgx.Identifier{"accounts"}, " \t"), pgbaton.ErrInvalidArgument)
	require.NoError(t, tx.Commit(ctx))
	for _, table := range []pgx.Identifier{{"missing"}, {"plain"}} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fencedwrite.BypassFencing(ctx, tx, table, "why") })
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%q", table)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.event").Scan(&n))
	require.Zero(t, n, "bad input wrote no audit row")
}
