package advisory_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// The keys pgbaton's lease clients take for themselves (listen slots,
// group gates) are refused to a Locker's users with a typed error, so a
// user's lock can neither block a client's slot nor take it and silently
// turn every client's wake-ups into polling. Before, Pair(1885495924, n)
// was granted, or waited on the client holding slot n.
func TestReservedKeysRefused(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	l := newLocker(t, pool, advisory.Config{})

	for lo := range int32(2) {
		key := advisory.Pair(advisory.ReservedPairHi, lo)
		_, err := l.TryLock(ctx, key)
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "TryLock %s", key)
		assert.Contains(t, err.Error(), "reserved")
		_, err = l.Lock(ctx, key)
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "Lock %s", key)
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return l.XactLock(ctx, tx, key) })
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "XactLock %s", key)
	}
	// Other first halves are the user's.
	lk, err := l.TryLock(ctx, advisory.Pair(advisory.ReservedPairHi-1, 0))
	require.NoError(t, err)
	require.NoError(t, lk.Unlock(ctx))

	for _, ns := range []string{"pgbaton", "pgbaton.lease_group", "pgbaton.x"} {
		_, err := advisory.NameKey(ns, "g")
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "namespace %q", ns)
		_, err = advisory.New(pool, advisory.Config{Namespace: ns})
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "namespace %q", ns)
	}
	_, err = advisory.NameKey("pgbatonic", "g")
	require.NoError(t, err, "only pgbaton and pgbaton.* are reserved")

	// The constants are the keys the schema takes.
	var slots, gate string
	require.NoError(t, pool.QueryRow(ctx, "SELECT prosrc FROM pg_proc WHERE proname = 'listen_start'").Scan(&slots))
	assert.Contains(t, slots, "pg_try_advisory_lock("+strconv.Itoa(int(advisory.ReservedPairHi))+",")
	require.NoError(t, pool.QueryRow(ctx, "SELECT prosrc FROM pg_proc WHERE proname = 'group_gate'").Scan(&gate))
	assert.Contains(t, gate, "'"+advisory.ReservedNamespace+".lease_group'")
}
