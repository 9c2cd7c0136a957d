package advisory_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// The keys pgbaton's lease protocol takes for itself (listen slots, group
// gates) are refused to a Locker's users with a typed error, so a user's
// lock can neither block a client's slot nor take it and silently turn
// every client's wake-ups into polling. Before, Pair(1885495924, n) was
// granted, or waited on the client holding slot n.
func TestReservedKeysRefused(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	l := newLocker(t, pool, advisory.Config{})

	for _, key := range []advisory.Key{
		advisory.Pair(advisory.ReservedPairHi, 0), advisory.Pair(advisory.ReservedPairHi, 1), // listen slots
		advisory.Pair(advisory.ReservedPairHi+1, 12345), // a group's gate
		advisory.Pair(advisory.ReservedPairHi+2, 12345), // a wait queue's lock
		advisory.Pair(advisory.ReservedPairHi+3, 12345), // a lease session's
	} {
		_, err := l.TryLock(ctx, key)
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "TryLock %s", key)
		assert.Contains(t, err.Error(), "reserved")
		_, err = l.Lock(ctx, key)
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "Lock %s", key)
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return l.XactLock(ctx, tx, key) })
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "XactLock %s", key)
	}
	// Other first halves are the user's.
	for _, hi := range []int32{advisory.ReservedPairHi - 1, advisory.ReservedPairHi + 4} {
		lk, err := l.TryLock(ctx, advisory.Pair(hi, 0))
		require.NoError(t, err)
		require.NoError(t, lk.Unlock(ctx))
	}

	// The constant is the first half the schema takes: its listen slots
	// and its group gate name it through pgbaton.reserved_pair_hi.
	var hi int32
	require.NoError(t, pool.QueryRow(ctx, "SELECT pgbaton.reserved_pair_hi()").Scan(&hi))
	assert.Equal(t, advisory.ReservedPairHi, hi)
	var slots, gate string
	require.NoError(t, pool.QueryRow(ctx, "SELECT prosrc FROM pg_proc WHERE proname = 'listen_start'").Scan(&slots))
	assert.Contains(t, slots, "pg_try_advisory_lock(pgbaton.reserved_pair_hi(),")
	require.NoError(t, pool.QueryRow(ctx, "SELECT prosrc FROM pg_proc WHERE proname = 'group_gate'").Scan(&gate))
	assert.Contains(t, gate, "pg_advisory_xact_lock(pgbaton.reserved_pair_hi() + 1,")
	var queue string
	require.NoError(t, pool.QueryRow(ctx, "SELECT prosrc FROM pg_proc WHERE proname = 'queue_lock'").Scan(&queue))
	assert.Contains(t, queue, "pg_advisory_xact_lock(pgbaton.reserved_pair_hi() + 2,")
}
