package fencedwrite_test

import (
	"context"
	"os/exec"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

func fencedTable(t *testing.T, ctx context.Context, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(ctx, "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, fence_token bigint)")
	require.NoError(t, err)
	require.NoError(t, fencedwrite.EnableFencing(ctx, pool, pgx.Identifier{"public", "accounts"}))
	require.NoError(t, fencedwrite.EnableFencing(ctx, pool, pgx.Identifier{"accounts"}), "again: a no-op")
	_, err = pool.Exec(ctx, "INSERT INTO accounts VALUES (1, 100, 7)")
	require.NoError(t, err)
}

func balance(t *testing.T, ctx context.Context, pool *pgxpool.Pool) (balance int, token int64) {
	t.Helper()
	require.NoError(t, pool.QueryRow(ctx, "SELECT balance, fence_token FROM accounts WHERE id = 1").Scan(&balance, &token))
	return balance, token
}

// The trigger works for any client: here psql, the way an operator or a
// script in another language would write.
func TestTriggerRejectsStaleWriteFromPsql(t *testing.T) {
	ctx := testContext(t)
	db := env.DB(t)
	pool := db.Pool(t)
	fencedTable(t, ctx, pool)

	psql := func(sql string) (string, error) {
		out, err := exec.CommandContext(ctx, "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose",
			"-d", db.URL, "-c", sql).CombinedOutput()
		return string(out), err
	}
	if _, err := exec.LookPath("psql"); err != nil {
		// No psql on this machine: the simple query protocol is what psql
		// speaks, so send the same text that way.
		conn, err := pgx.Connect(ctx, db.URL)
		require.NoError(t, err)
		defer conn.Close(ctx)
		psql = func(sql string) (string, error) {
			_, err := conn.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol)
			if err != nil {
				return err.Error(), err
			}
			return "", nil
		}
	}

	out, err := psql("UPDATE accounts SET balance = 0, fence_token = 6 WHERE id = 1")
	require.Error(t, err, out)
	require.Contains(t, out, "PB001")
	require.Contains(t, out, "stale fencing token")
	b, tok := balance(t, ctx, pool)
	require.Equal(t, 100, b)
	require.Equal(t, int64(7), tok)

	out, err = psql("DELETE FROM accounts WHERE id = 1")
	require.Error(t, err, out)
	require.Contains(t, out, "PB001", "a delete without a token is refused")

	out, err = psql("UPDATE accounts SET balance = 0 WHERE id = 1")
	require.Error(t, err, out)
	require.Contains(t, out, "none presented, current 7 (no token)", "an update without a token is refused")

	out, err = psql("UPDATE accounts SET balance = 50, fence_token = 8 WHERE id = 1")
	require.NoError(t, err, out)
	b, tok = balance(t, ctx, pool)
	require.Equal(t, 50, b)
	require.Equal(t, int64(8), tok)

	out, err = psql("DELETE FROM accounts WHERE id = 1 AND pgbaton.present_token(8)")
	require.NoError(t, err, out)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM accounts").Scan(&n))
	require.Zero(t, n)
}

func TestTriggerFromGo(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	fencedTable(t, ctx, pool)

	// Same token: the same holder writes again.
	_, err := pool.Exec(ctx, "UPDATE accounts SET balance = 90, fence_token = 7 WHERE id = 1")
	require.NoError(t, err)
	// Older token.
	_, err = pool.Exec(ctx, "UPDATE accounts SET balance = 0, fence_token = 3 WHERE id = 1")
	requireStale(t, fencedwrite.MapError(err), "public.accounts", 3, 7, "older than the row's")
	// Writing NULL over a token fails closed.
	_, err = pool.Exec(ctx, "UPDATE accounts SET fence_token = NULL WHERE id = 1")
	requireStale(t, fencedwrite.MapError(err), "public.accounts", 0, 7, "no token")
	// An upsert goes through the UPDATE path.
	_, err = pool.Exec(ctx, `INSERT INTO accounts VALUES (1, 0, 5)
		ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, fence_token = excluded.fence_token`)
	requireStale(t, fencedwrite.MapError(err), "public.accounts", 5, 7, "older than the row's")

	// DELETE presents the transaction's token.
	del := func(token int64) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := fencedwrite.SetToken(ctx, tx, token); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "DELETE FROM accounts WHERE id = 1")
			return err
		})
	}
	requireStale(t, fencedwrite.MapError(del(6)), "public.accounts", 6, 7, "older than the row's")
	// The setting also holds back an UPDATE that leaves fence_token alone.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		require.NoError(t, fencedwrite.SetToken(ctx, tx, 2))
		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = 1 WHERE id = 1")
		return err
	})
	requireStale(t, fencedwrite.MapError(err), "public.accounts", 2, 7, "older than the row's")
	// The setting ended with its transaction.
	var setting string
	require.NoError(t, pool.QueryRow(ctx, "SELECT coalesce(current_setting('pgbaton.fence_token', true), '')").Scan(&setting))
	require.Empty(t, setting)
	b, _ := balance(t, ctx, pool)
	require.Equal(t, 90, b)

	require.NoError(t, del(7))

	// Rows without a token are not fenced yet; inserting is never fenced.
	_, err = pool.Exec(ctx, "INSERT INTO accounts VALUES (2, 1, NULL)")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE accounts SET balance = 2 WHERE id = 2")
	require.NoError(t, err)

	// Disabled, the table is plain again.
	require.NoError(t, fencedwrite.DisableFencing(ctx, pool, pgx.Identifier{"accounts"}))
	require.NoError(t, fencedwrite.DisableFencing(ctx, pool, pgx.Identifier{"accounts"}), "again: a no-op")
	_, err = pool.Exec(ctx, "UPDATE accounts SET fence_token = 1 WHERE id = 2")
	require.NoError(t, err)
}

func TestEnableFencingBadInput(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE plain (id int); CREATE TABLE wrong (fence_token int);
		CREATE VIEW v AS SELECT 1::bigint AS fence_token; CREATE TABLE "Odd ""name""" (fence_token bigint)`)
	require.NoError(t, err)
	for _, table := range []pgx.Identifier{
		nil, {}, {""}, {"a", "b", "c", "d"}, {"public", ""},
		{"missing"}, {"plain"}, {"wrong"}, {"v"}, {"pgbaton", "lease_token_seq"},
	} {
		require.ErrorIs(t, fencedwrite.EnableFencing(ctx, pool, table), pgbaton.ErrInvalidArgument, "%q", table)
	}
	require.ErrorIs(t, fencedwrite.EnableFencing(ctx, nil, pgx.Identifier{"plain"}), pgbaton.ErrInvalidArgument)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_trigger WHERE tgname = 'pgbaton_reject_stale_token'").Scan(&n))
	require.Zero(t, n, "bad input installed nothing")

	// Quoting is pgx's: a name that needs it works.
	require.NoError(t, fencedwrite.EnableFencing(ctx, pool, pgx.Identifier{`Odd "name"`}))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_trigger WHERE tgname = 'pgbaton_reject_stale_token'").Scan(&n))
	require.Equal(t, 1, n)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	require.ErrorIs(t, fencedwrite.SetToken(ctx, tx, 0), pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, fencedwrite.SetToken(ctx, nil, 1), pgbaton.ErrInvalidArgument)

	// The trigger function refuses to be installed the wrong way.
	_, err = pool.Exec(ctx, `CREATE TABLE ins (fence_token bigint);
		CREATE TRIGGER wrong AFTER INSERT ON ins FOR EACH ROW EXECUTE FUNCTION pgbaton.reject_stale_token()`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO ins VALUES (1)")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42P17", pgErr.Code)
	_, err = pool.Exec(ctx, `DROP TRIGGER wrong ON ins;
		CREATE TRIGGER wrong AFTER INSERT ON ins FOR EACH ROW EXECUTE FUNCTION pgbaton.fence_token_set()`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO ins VALUES (1)")
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42P17", pgErr.Code)
}

// Down-migrating pgbaton (which drops the function without CASCADE)
// refuses to strip a user table of its fence.
func TestFencedTableBlocksDownMigration(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	fencedTable(t, ctx, pool)
	_, err := pool.Exec(ctx, "DROP FUNCTION pgbaton.reject_stale_token()")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "2BP01", pgErr.Code) // dependent_objects_still_exist
	b, _ := balance(t, ctx, pool)
	require.Equal(t, 100, b)
}

// An UPDATE must carry a token: a statement that forgets it is refused,
// however it is spelt.
func TestUpdateWithoutTokenIsRejected(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	fencedTable(t, ctx, pool) // row 1: balance 100, token 7

	// MERGE is PostgreSQL 15 and later; before, the same write is spelt
	// UPDATE ... FROM.
	merge := func(set string) string {
		return "MERGE INTO accounts a USING (VALUES (1)) s(id) ON a.id = s.id WHEN MATCHED THEN UPDATE SET " + set
	}
	if pgtest.ServerVersion(t, pool) < 150000 {
		merge = func(set string) string {
			return "UPDATE accounts a SET " + set + " FROM (VALUES (1)) s(id) WHERE a.id = s.id"
		}
	}
	for _, sql := range []string{
		"UPDATE accounts SET balance = 1 WHERE id = 1",
		"INSERT INTO accounts VALUES (1, 1, 9) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance",
		merge("balance = 1"),
	} {
		_, err := pool.Exec(ctx, sql)
		requireStale(t, fencedwrite.MapError(err), "public.accounts", 0, 7, "no token")
	}
	b, tok := balance(t, ctx, pool)
	require.Equal(t, 100, b)
	require.Equal(t, int64(7), tok)

	// Setting the column presents a token, even the row's own: the same
	// holder writes again.
	_, err := pool.Exec(ctx, "UPDATE accounts SET balance = 90, fence_token = 7 WHERE id = 1")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, merge("balance = 91, fence_token = 7"))
	require.NoError(t, err)

	// So does the transaction's token, and the row remembers it: an older
	// token cannot write after it.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		require.NoError(t, fencedwrite.SetToken(ctx, tx, 9))
		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = 80 WHERE id = 1")
		return err
	})
	require.NoError(t, err)
	b, tok = balance(t, ctx, pool)
	require.Equal(t, 80, b)
	require.Equal(t, int64(9), tok, "the row remembers the token of its last writer")
	_, err = pool.Exec(ctx, "UPDATE accounts SET balance = 0, fence_token = 8 WHERE id = 1")
	requireStale(t, fencedwrite.MapError(err), "public.accounts", 8, 9, "older than the row's")

	// In one statement: pgbaton.present_token in the WHERE clause.
	_, err = pool.Exec(ctx, "UPDATE accounts SET balance = 70 WHERE id = 1 AND pgbaton.present_token($1)", 8)
	requireStale(t, fencedwrite.MapError(err), "public.accounts", 8, 9, "older than the row's")
	_, err = pool.Exec(ctx, "UPDATE accounts SET balance = 70 WHERE id = 1 AND pgbaton.present_token($1)", 10)
	require.NoError(t, err)
	b, tok = balance(t, ctx, pool)
	require.Equal(t, 70, b)
	require.Equal(t, int64(10), tok)
	// The token lasted for that statement's transaction only.
	_, err = pool.Exec(ctx, "UPDATE accounts SET balance = 1 WHERE id = 1")
	requireStale(t, fencedwrite.MapError(err), "public.accounts", 0, 10, "no token")
}

// A DELETE with a valid token goes through, in a transaction or in a
// single statement; one with an older token or none does not.
func TestDeleteWithToken(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	fencedTable(t, ctx, pool) // row 1: token 7
	_, err := pool.Exec(ctx, "INSERT INTO accounts VALUES (2, 5, 7), (3, 5, 7)")
	require.NoError(t, err)
	count := func() (n int) {
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM accounts").Scan(&n))
		return n
	}

	_, err = pool.Exec(ctx, "DELETE FROM accounts WHERE id = 1")
	requireStale(t, fencedwrite.MapError(err), "public.accounts", 0, 7, "no token")
	_, err = pool.Exec(ctx, "DELETE FROM accounts WHERE id = 1 AND pgbaton.present_token($1)", 6)
	requireStale(t, fencedwrite.MapError(err), "public.accounts", 6, 7, "older than the row's")
	require.Equal(t, 3, count())

	// Autocommit, one statement: the way pool.Exec and psql -c send it.
	tag, err := pool.Exec(ctx, "DELETE FROM accounts WHERE id = 1 AND pgbaton.present_token($1)", 7)
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())
	// In a transaction, with SetToken.
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := fencedwrite.SetToken(ctx, tx, 8); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "DELETE FROM accounts WHERE id = 2")
		return err
	}))
	// In SQL, with SET LOCAL, simple protocol as psql sends it.
	_, err = pool.Exec(ctx, "BEGIN; SET LOCAL pgbaton.fence_token = 7; DELETE FROM accounts WHERE id = 3; COMMIT",
		pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
	require.Zero(t, count())

	// Bad tokens are bad input, not a stale token.
	for _, bad := range []any{0, -1, nil} {
		_, err = pool.Exec(ctx, "SELECT pgbaton.present_token($1::bigint)", bad)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "%v", bad)
		require.Equal(t, "22023", pgErr.Code)
	}
}
