package leasetable_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/migrations"
)

// TestStatementsArePlannedOnce: the statements inside pgbaton's functions
// keep their plans across calls. Postgres plans a statement of a plpgsql
// function afresh at every call when it judges the generic plan costlier
// than a custom one (a join with an array parameter, whose size it
// guesses), and a LANGUAGE sql function it cannot inline at every call
// whatever it does: complete_many's join and claim's grant were planned
// at every call, 40–70 µs each, a third of a one-item
// CompleteAndClaim. pg_stat_statements counts plans per nested statement.
func TestStatementsArePlannedOnce(t *testing.T) {
	cl := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true, Settings: map[string]string{
		"shared_preload_libraries":          "pg_stat_statements",
		"pg_stat_statements.track":          "all",
		"pg_stat_statements.track_planning": "on",
	}})
	ctx := pgtest.Context(t, 2*time.Minute)
	require.NoError(t, migrations.UpURL(ctx, cl.URL("postgres")))
	pool := pgtest.Pool(t, cl.URL("postgres"))
	_, err := pool.Exec(ctx, "CREATE EXTENSION pg_stat_statements")
	require.NoError(t, err)
	c := newClient(t, pool, leasetable.Config{Owner: "plans"})

	const rounds = 60
	names := make([]string, rounds*12)
	for i := range names {
		names[i] = fmt.Sprintf("item-%04d", i)
	}
	_, err = c.Register(ctx, "g", names...)
	require.NoError(t, err)
	for i := range rounds {
		l, err := c.TryAcquire(ctx, fmt.Sprintf("k%d", i%5))
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		ls, err := c.Claim(ctx, "g", 3)
		require.NoError(t, err)
		ls, err = c.CompleteAndClaim(ctx, "g", 2, ls...)
		require.NoError(t, err)
		require.NoError(t, c.Complete(ctx, ls...))
		ls, err = c.Claim(ctx, "g", 2)
		require.NoError(t, err)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, c.CompleteTx(ctx, tx, ls...))
		require.NoError(t, tx.Commit(ctx))
		ls, err = c.Claim(ctx, "g", 2)
		require.NoError(t, err)
		for _, l := range ls {
			require.NoError(t, l.Release(ctx))
		}
	}
	// Each backend makes five custom plans first, then settles on the
	// generic one (or keeps planning). The nested statements are the
	// functions' own; before PostgreSQL 14 (no toplevel column) the
	// client's statements are judged with them, by the same rule.
	nested := "NOT toplevel"
	if pgtest.ServerVersion(t, pool) < 140000 {
		nested = "true"
	}
	rows, err := pool.Query(ctx, `
		SELECT calls, plans, left(regexp_replace(query, '\s+', ' ', 'g'), 120)
		  FROM pg_stat_statements
		 WHERE `+nested+` AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		   AND calls >= $1 AND plans * 2 > calls ORDER BY plans DESC`, rounds)
	require.NoError(t, err)
	replanned, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var calls, plans int64
		var q string
		err := r.Scan(&calls, &plans, &q)
		return fmt.Sprintf("%d plans in %d calls: %s", plans, calls, q), err
	})
	require.NoError(t, err)
	assert.Empty(t, replanned, "statements planned again at every call")
}
