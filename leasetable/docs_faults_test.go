package leasetable_test

// The tests that docs/work-queues.md and docs/leader-election.md show: each
// tests the page's own code (example_docs_test.go) under a fault made with
// pgbatontest, as a user's tests would.

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/pgbatontest"
)

func TestSendOneWritesNothingForALostItem(t *testing.T) {
	ctx := context.Background()
	pool := env.DB(t).Pool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE sent (mail text PRIMARY KEY)")
	require.NoError(t, err)
	client := newClient(t, pool, leasetable.Config{Owner: "worker-1"})
	_, err = client.Register(ctx, "mail", "mail-1")
	require.NoError(t, err)
	items, err := client.Claim(ctx, "mail", 1)
	require.NoError(t, err)

	// Another worker takes the item over while this one is paused.
	_, err = pgbatontest.TakeOver(ctx, items[0], "worker-2")
	require.NoError(t, err)

	err = sendOne(pool, client, items[0])
	require.ErrorIs(t, err, leasetable.ErrLeaseLost)
	var sent int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM sent").Scan(&sent))
	require.Zero(t, sent, "nothing is written for an item this worker lost")
	pgbatontest.RequireHeld(t, pool, "mail-1", "worker-2")
}

func TestAdvanceAfterALeaderChange(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pool := env.DB(t).Pool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE schedule (next_run timestamptz, term bigint);
		INSERT INTO schedule VALUES (now(), 0)`)
	require.NoError(t, err)
	client := newClient(t, pool, leasetable.Config{Owner: "replica-a"})
	leader, err := client.Elect(ctx, "scheduler", "10.0.0.7:8080")
	require.NoError(t, err)
	require.NoError(t, advance(ctx, pool, leader.Term()))

	// Another replica becomes leader while this one is paused.
	term, err := pgbatontest.TakeOver(ctx, leader.Lease(), "replica-b")
	require.NoError(t, err)
	<-leader.Done()

	require.ErrorIs(t, advance(ctx, pool, leader.Term()), fencedwrite.ErrStaleToken, "the old term writes nothing")
	require.NoError(t, advance(ctx, pool, term), "the new leader's term does")
}
