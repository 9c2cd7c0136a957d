package advisory_test

import (
	"bytes"
	"context"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// goroutineID is the running goroutine's number, from its stack header.
func goroutineID() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// ioRecorder notes which goroutines read and write the connections it
// dials, while on.
type ioRecorder struct {
	on  atomic.Bool
	mu  sync.Mutex
	ids map[uint64]int
}

func (r *ioRecorder) note() {
	if r.on.Load() {
		id := goroutineID()
		r.mu.Lock()
		r.ids[id]++
		r.mu.Unlock()
	}
}

// take returns the goroutines seen since the last take.
func (r *ioRecorder) take() map[uint64]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := r.ids
	r.ids = map[uint64]int{}
	return ids
}

type recordedConn struct {
	net.Conn
	r *ioRecorder
}

func (c recordedConn) Read(b []byte) (int, error)  { c.r.note(); return c.Conn.Read(b) }
func (c recordedConn) Write(b []byte) (int, error) { c.r.note(); return c.Conn.Write(b) }

// NetConn lets the session watch the socket itself while idle.
func (c recordedConn) NetConn() net.Conn { return c.Conn }

// A caller whose session is idle reads and writes the socket itself:
// TryLock, Unlock, and a Lock that waits (on a spare or a new session),
// grant included, reach the wire with no hand-off to the session's
// goroutine and back. Each hand-off is a goroutine woken on the critical
// path of every handover; raw pgx has none (bench: the contended and
// SIGKILL handover scenarios).
func TestIdleSessionIOOnCallersGoroutine(t *testing.T) {
	d := env.DB(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	rec := &ioRecorder{ids: map[uint64]int{}}
	pool := d.Pool(t, func(cfg *pgxpool.Config) {
		dial := cfg.ConnConfig.DialFunc
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return recordedConn{Conn: c, r: rec}, nil
		}
	})
	l := newLocker(t, pool, advisory.Config{PingInterval: time.Minute})
	other := newLocker(t, d.Pool(t), advisory.Config{})
	key := advisory.Int64(42)
	lk, err := l.TryLock(ctx, key)
	require.NoError(t, err)
	require.True(t, advisory.FastPathForTest(t, l), "the session is not a direct connection")
	require.NoError(t, lk.Unlock(ctx))

	// The wait in round 0 opens a session on a connection the pool has
	// already made: pgxpool makes new ones on a goroutine of its own.
	warm, err := pool.Acquire(ctx)
	require.NoError(t, err)
	warm.Release()
	me := goroutineID()
	rec.on.Store(true)
	for range 20 {
		lk, err := l.TryLock(ctx, key)
		require.NoError(t, err)
		require.NoError(t, lk.Unlock(ctx))
	}
	for range 3 { // a new waiting session, then a spare, twice
		held, err := other.TryLock(ctx, key)
		require.NoError(t, err)
		unlocked := make(chan error, 1)
		go func() {
			eventuallyWaiting(t, admin, d, 1)
			unlocked <- held.Unlock(ctx)
		}()
		lk, err := l.Lock(ctx, key)
		require.NoError(t, err)
		require.NoError(t, lk.Unlock(ctx))
		require.NoError(t, <-unlocked)
	}
	rec.on.Store(false)
	ids := rec.take()
	mine := ids[me]
	delete(ids, me)
	others := 0
	for _, n := range ids {
		others += n
	}
	// 23 locks and unlocks, a read and a write each. A session idle for
	// over 10 ms watches its socket, and its next request goes
	// through its goroutine: the test's first lock and its first try of
	// a wait, and any stall of the test that long (on a loaded machine).
	t.Logf("reads and writes: %d on the caller's goroutine, %d on others", mine, others)
	require.GreaterOrEqual(t, mine+others, 4*23)
	require.GreaterOrEqual(t, mine, 3*others, "locks, waits, grants or unlocks went through another goroutine")
}
