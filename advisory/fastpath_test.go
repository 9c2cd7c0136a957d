package advisory_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// A session on a direct connection calls the lock functions by the
// fast-path protocol; through a proxy it runs the token-guarded prepared
// statements. Both must take, wait for and release every kind of key the
// same way. The uncontended blocking Lock on a spare session is the case
// the fast path handles differently (the blocking call alone, granted at
// once): after its Unlock the key must be free for others.
func TestFastPathAndStatementsAgree(t *testing.T) {
	d := env.DB(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	proxied, _ := env.ProxiedPool(t, d)
	other := newLocker(t, d.Pool(t), advisory.Config{})
	for _, path := range []struct {
		name string
		pool *pgxpool.Pool
		fast bool
	}{{"direct", d.Pool(t), true}, {"proxied", proxied, false}} {
		t.Run(path.name, func(t *testing.T) {
			l := newLocker(t, path.pool, advisory.Config{})
			require.Equal(t, path.fast, advisory.FastPathForTest(t, l))
			for i, v := range []struct {
				key    advisory.Key
				shared bool
			}{
				{advisory.Int64(301), false}, {advisory.Int64(302), true},
				{advisory.Pair(301, 1), false}, {advisory.Pair(301, 2), true},
			} {
				lock := l.Lock
				if v.shared {
					lock = l.RLock
				}
				// Contended: other holds the key while l waits.
				held, err := other.TryLock(ctx, v.key)
				require.NoError(t, err)
				lk := handOver(t, admin, d, held, lock, v.key)
				require.Equal(t, v.shared, lk.Shared())
				_, err = other.TryLock(ctx, v.key)
				require.ErrorIs(t, err, advisory.ErrLocked, v.key.String())
				require.NoError(t, lk.Unlock(ctx))

				// Uncontended, on the idle session the wait left: then
				// free for others once unlocked, at once or later.
				lk, err = lock(ctx, v.key)
				require.NoError(t, err)
				if i%2 == 1 {
					_, err = other.TryLock(ctx, v.key)
					require.ErrorIs(t, err, advisory.ErrLocked, v.key.String())
				}
				require.NoError(t, lk.Unlock(ctx))
				mine, err := other.TryLock(ctx, v.key)
				require.NoError(t, err, "%s still held after Unlock", v.key)
				require.NoError(t, mine.Unlock(ctx))
			}
			granted, waiting := advisoryLocks(t, admin, d)
			require.Zero(t, granted)
			require.Zero(t, waiting)
			st := l.Stats()
			if !path.fast {
				// On the fast path a wait counts as contended by how long
				// its grant took (see TestWaitOnSpareSendsOneCall), which
				// a handover as quick as these may not reach.
				require.GreaterOrEqual(t, st.Contended, int64(4), "%+v", st)
			}
		})
	}
}

// A Lock that waits on a spare session sends the blocking call alone:
// a try first would cost the server a call (its own transaction) per
// acquisition of a contended key (bench, contended scenario: about 8 %
// of the throughput of eight clients taking turns on one key).
func TestWaitOnSpareSendsOneCall(t *testing.T) {
	d := env.DB(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	// No ping may go out on the spare while it is traced: a pause of a
	// busy machine as long as the default PingInterval (1s) would send
	// one, and a ping is a function call too.
	l := newLocker(t, d.Pool(t), advisory.Config{PingInterval: time.Minute})
	other := newLocker(t, d.Pool(t), advisory.Config{})
	require.True(t, advisory.FastPathForTest(t, l))
	contendedLock := func(key advisory.Key) {
		t.Helper()
		held, err := other.TryLock(ctx, key)
		require.NoError(t, err)
		require.NoError(t, handOver(t, admin, d, held, l.Lock, key).Unlock(ctx))
	}
	// The first wait opens a session, parked as a spare once unlocked.
	contendedLock(advisory.Int64(1))
	var trace pgtest.Log
	require.Equal(t, 1, advisory.TraceSparesForTest(l, &trace))
	contendedLock(advisory.Int64(2))
	calls := strings.Count(trace.String(), "FunctionCallResponse")
	require.Equal(t, 2, calls, "the wait's call and the unlock's:\n%s", trace.String())
}
