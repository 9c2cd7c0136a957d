package fencedwrite_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/fencedwrite"
)

// effects is the consumer's own table: one row per time a message's work
// was done.
func effects(t *testing.T, ctx context.Context, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(ctx, "CREATE TABLE effects (message text NOT NULL)")
	require.NoError(t, err)
}

func effectCount(t *testing.T, ctx context.Context, pool *pgxpool.Pool, message string) (n int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM effects WHERE message = $1", message).Scan(&n))
	return n
}

// handle processes message once for consumer: the mark and the work in one
// transaction.
func handle(ctx context.Context, pool *pgxpool.Pool, consumer, message string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := fencedwrite.MarkProcessed(ctx, tx, consumer, message); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1)", message)
		return err
	})
}

func TestMarkProcessedReportsARepeat(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	effects(t, ctx, pool)

	require.NoError(t, handle(ctx, pool, "billing", "m1"))
	err := handle(ctx, pool, "billing", "m1")
	require.ErrorIs(t, err, fencedwrite.ErrAlreadyProcessed)
	require.NotErrorIs(t, err, fencedwrite.ErrStaleToken)
	require.Contains(t, err.Error(), `"billing"`)
	require.Contains(t, err.Error(), `"m1"`)
	require.Equal(t, 1, effectCount(t, ctx, pool, "m1"))

	// Another consumer has its own record of the same message.
	require.NoError(t, handle(ctx, pool, "audit", "m1"))
	require.Equal(t, 2, effectCount(t, ctx, pool, "m1"))

	// Work done before the mark rolls back with the repeat, even if the
	// caller ignores the error and commits: the transaction is aborted.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO effects VALUES ('m1')")
	require.NoError(t, err)
	require.ErrorIs(t, fencedwrite.MarkProcessed(ctx, tx, "billing", "m1"), fencedwrite.ErrAlreadyProcessed)
	require.ErrorIs(t, tx.Commit(ctx), pgx.ErrTxCommitRollback)
	require.Equal(t, 2, effectCount(t, ctx, pool, "m1"))

	// A transaction that rolls back leaves no record: the message is
	// processed when it comes again.
	boom := errors.New("boom")
	require.ErrorIs(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := fencedwrite.MarkProcessed(ctx, tx, "billing", "m2"); err != nil {
			return err
		}
		return boom
	}), boom)
	require.NoError(t, handle(ctx, pool, "billing", "m2"))
	require.Equal(t, 1, effectCount(t, ctx, pool, "m2"))

	// The SQL twin, for consumers in other languages.
	_, err = pool.Exec(ctx, "SELECT pgbaton.mark_processed('billing', 'm2')")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, fencedwrite.SQLStateAlreadyProcessed, pgErr.Code)
}

// A delivery arriving while the first is still being processed waits for
// it: if the first commits, the second is a repeat; if the first rolls
// back, the second does the work.
func TestMarkProcessedConcurrentDeliveries(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	effects(t, ctx, pool)

	for _, firstCommits := range []bool{true, false} {
		message := fmt.Sprintf("m-%v", firstCommits)
		first, err := pool.Begin(ctx)
		require.NoError(t, err)
		// On failure too: an open transaction would keep the pool from closing.
		defer first.Rollback(context.WithoutCancel(ctx))
		require.NoError(t, fencedwrite.MarkProcessed(ctx, first, "billing", message))
		_, err = first.Exec(ctx, "INSERT INTO effects VALUES ($1)", message)
		require.NoError(t, err)

		pid, second := async(t, ctx, pool, func(c *pgx.Conn) (struct{}, error) {
			return struct{}{}, pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
				if err := fencedwrite.MarkProcessed(ctx, tx, "billing", message); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1)", message)
				return err
			})
		})
		waitBlocked(t, ctx, pool, pid)
		if firstCommits {
			require.NoError(t, first.Commit(ctx))
			_, err = receive(t, second)
			require.ErrorIs(t, err, fencedwrite.ErrAlreadyProcessed)
		} else {
			require.NoError(t, first.Rollback(ctx))
			_, err = receive(t, second)
			require.NoError(t, err)
		}
		require.Equal(t, 1, effectCount(t, ctx, pool, message), "exactly one delivery did the work")
	}
}

// Many deliveries of one message at once: exactly one does the work.
func TestMarkProcessedRace(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	effects(t, ctx, pool)

	const deliveries = 8
	start := make(chan struct{})
	errs := make(chan error, deliveries)
	var wg sync.WaitGroup
	for range deliveries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs <- handle(ctx, pool, "billing", "m1")
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	var done, repeats int
	for err := range errs {
		switch {
		case err == nil:
			done++
		case errors.Is(err, fencedwrite.ErrAlreadyProcessed):
			repeats++
		default:
			t.Fatalf("unexpected error: %v", err)
		}
	}
	require.Equal(t, 1, done)
	require.Equal(t, deliveries-1, repeats)
	require.Equal(t, 1, effectCount(t, ctx, pool, "m1"))
}

func TestPruneProcessed(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	effects(t, ctx, pool)
	for i := range 8 {
		require.NoError(t, handle(ctx, pool, "billing", fmt.Sprintf("m%d", i)))
	}
	// Five records are eight days old, three are new.
	_, err := pool.Exec(ctx, `UPDATE pgbaton.processed_message SET processed_at = processed_at - interval '8 days'
		WHERE message_id IN ('m0', 'm1', 'm2', 'm3', 'm4')`)
	require.NoError(t, err)
	remaining := func() []string {
		rows, err := pool.Query(ctx, "SELECT message_id FROM pgbaton.processed_message ORDER BY message_id")
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return ids
	}

	n, err := fencedwrite.PruneProcessed(ctx, pool, fencedwrite.PruneConfig{Batch: 2}) // default retention: 7 days
	require.NoError(t, err)
	require.Equal(t, int64(5), n)
	require.Equal(t, []string{"m5", "m6", "m7"}, remaining())

	n, err = fencedwrite.PruneProcessed(ctx, pool, fencedwrite.PruneConfig{})
	require.NoError(t, err)
	require.Zero(t, n, "nothing old left")

	// A pruned message is processed again if it comes back: retention must
	// outlast redelivery.
	require.NoError(t, handle(ctx, pool, "billing", "m0"))

	// In SQL, one batch per call, with the same default retention.
	_, err = pool.Exec(ctx, `UPDATE pgbaton.processed_message SET processed_at = processed_at - interval '1 hour'`)
	require.NoError(t, err)
	var deleted int
	require.NoError(t, pool.QueryRow(ctx, "SELECT pgbaton.prune_processed()").Scan(&deleted))
	require.Zero(t, deleted)
	require.NoError(t, pool.QueryRow(ctx, "SELECT pgbaton.prune_processed(interval '30 minutes', 3)").Scan(&deleted))
	require.Equal(t, 3, deleted)
	n, err = fencedwrite.PruneProcessed(ctx, pool, fencedwrite.PruneConfig{Retention: 30 * time.Minute})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Empty(t, remaining())
}

func TestProcessedBadInput(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	long := strings.Repeat("x", 256)
	require.ErrorIs(t, fencedwrite.MarkProcessed(ctx, nil, "c", "m"), pgbaton.ErrInvalidArgument)
	for _, args := range [][2]string{{"", "m"}, {"c", ""}, {long, "m"}, {"c", long}} {
		require.ErrorIs(t, fencedwrite.MarkProcessed(ctx, tx, args[0], args[1]), pgbaton.ErrInvalidArgument, "%q", args)
	}
	require.NoError(t, fencedwrite.MarkProcessed(ctx, tx, "c", "m"), "bad input left the transaction usable")

	for _, cfg := range []fencedwrite.PruneConfig{
		{Retention: -time.Second}, {Batch: -1}, {Batch: 100001},
	} {
		_, err := fencedwrite.PruneProcessed(ctx, pool, cfg)
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%+v", cfg)
	}
	_, err = fencedwrite.PruneProcessed(ctx, nil, fencedwrite.PruneConfig{})
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)

	for _, sql := range []string{
		"SELECT pgbaton.mark_processed('', 'm')", "SELECT pgbaton.mark_processed('c', NULL)",
		"SELECT pgbaton.prune_processed(interval '0')", "SELECT pgbaton.prune_processed(interval '1 day', 0)",
	} {
		_, err := pool.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, sql)
		require.Equal(t, "22023", pgErr.Code, sql)
	}
}
