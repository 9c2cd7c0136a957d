package test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// A session lock ended on the server's side (pg_terminate_backend here;
// a reset connection, a restart or an idle-session killer are the same) is
// free for others at once, while its holder learns of the loss only at its
// next round trip: within PingInterval + PingTimeout. This measures that
// window, in which an advisory lock alone does not exclude, and checks its
// bound. (Leases have no such window: their loss is decided by expiry,
// which the holder's local deadline precedes; fenced writes close it for
// both.)
func TestAdvisoryServerSideLossWindow(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, time.Minute)
	cfg := advisory.Config{PingInterval: 500 * time.Millisecond, PingTimeout: time.Second}
	g := cfg.PingInterval + cfg.PingTimeout
	holderPool := d.Pool(t)
	holder, err := advisory.New(holderPool, cfg)
	require.NoError(t, err)
	defer holder.Close(ctx)
	other, err := advisory.New(d.Pool(t), cfg)
	require.NoError(t, err)
	defer other.Close(ctx)

	key := advisory.Name("window")
	lk, err := holder.TryLock(ctx, key)
	require.NoError(t, err)
	k, err := advisory.NameKey("", "window")
	require.NoError(t, err)
	var pid uint32
	require.NoError(t, holderPool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND ((classid::bigint << 32) | objid::bigint) = $1`, k).Scan(&pid))

	killed := time.Now()
	env.Terminate(t, pid)
	var taken *advisory.Lock
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		var err error
		taken, err = other.TryLock(ctx, key)
		if errors.Is(err, advisory.ErrLocked) {
			return false, nil
		}
		return err == nil, err
	}, "nobody could take the lock of a terminated session")
	grantedAfter := time.Since(killed)
	select {
	case <-lk.Done():
	case <-time.After(2 * g):
		t.Fatalf("holder not told of the loss within %s", 2*g)
	}
	learnedAfter := time.Since(killed)
	require.ErrorIs(t, lk.Err(), advisory.ErrLockLost)
	t.Logf("terminated holder: lock granted elsewhere after %s, holder told after %s (window %s, bound PingInterval+PingTimeout = %s)",
		grantedAfter.Round(time.Millisecond), learnedAfter.Round(time.Millisecond), (learnedAfter - grantedAfter).Round(time.Millisecond), g)
	assert.LessOrEqual(t, learnedAfter, g+500*time.Millisecond, "the holder learns within PingInterval + PingTimeout")
	require.NoError(t, taken.Unlock(ctx))
}
