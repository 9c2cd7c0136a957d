package advisory_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
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

// onPgxBackgroundReader reports whether the running goroutine is pgx's
// background reader, which pgconn starts under a connection of its own
// when a Write of a query of its takes over 15 ms (a stall of a loaded
// machine will do), lest a full socket buffer deadlock it: that is pgx's
// I/O on no goroutine of the session's.
func onPgxBackgroundReader() bool {
	var pcs [32]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs[:])])
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, "bgreader.(*BGReader).bgRead") {
			return true
		}
		if !more {
			return false
		}
	}
}

// ioAt is one of the connections a recorder dialled, and a goroutine
// that read or wrote it (0: pgx's background reader).
type ioAt struct {
	conn int32
	g    uint64
}

// ioRecorder notes which goroutines read and write which of the
// connections it dials, while on.
type ioRecorder struct {
	on    atomic.Bool
	conns atomic.Int32 // dialled
	mu    sync.Mutex
	ios   map[ioAt]int
}

func (r *ioRecorder) note(conn int32) {
	if r.on.Load() {
		at := ioAt{conn: conn}
		if !onPgxBackgroundReader() {
			at.g = goroutineID()
		}
		r.mu.Lock()
		r.ios[at]++
		r.mu.Unlock()
	}
}

// take returns the reads and writes seen since the last take.
func (r *ioRecorder) take() map[ioAt]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	ios := r.ios
	r.ios = map[ioAt]int{}
	return ios
}

type recordedConn struct {
	net.Conn
	r  *ioRecorder
	id int32
}

func (c recordedConn) Read(b []byte) (int, error)  { c.r.note(c.id); return c.Conn.Read(b) }
func (c recordedConn) Write(b []byte) (int, error) { c.r.note(c.id); return c.Conn.Write(b) }

// NetConn lets the session watch the socket itself while idle, as on
// any connection of its own dialler.
func (c recordedConn) NetConn() net.Conn { return c.Conn }

// idleWatchAfter is pgsession's (keep the two in step): a session idle
// that long takes its socket back from callers to watch it, and its
// next request goes through its goroutine.
const idleWatchAfter = 10 * time.Millisecond

// A caller whose session is idle reads and writes the socket itself:
// TryLock, Unlock, and a Lock that waits (on a spare or a new session),
// grant included, reach the wire with no hand-off to the session's
// goroutine and back. Each hand-off is a goroutine woken on the critical
// path of every handover; raw pgx has none (bench: the contended and
// SIGKILL handover scenarios).
//
// Each call is checked against what the design promised it when it
// ran, not counted: the share of calls on the caller's goroutine is
// what load changes (it required three times as many reads and writes
// there as elsewhere, and failed on busy machines). A session idle for
// idleWatchAfter takes its socket back to watch it, and its next
// request goes through its goroutine: any stall of the test that long
// does it. And the goroutine, once it has answered a request, yields
// twice (linger) before it lends the socket again: a caller that comes
// straight back queues again, and on a loaded machine, where the two
// seldom run at once, call after call does. Neither can befall a call
// that ends within idleWatchAfter of the start of one that ran on the
// caller's goroutine on the same connection: that one gave the socket
// back before it returned, and the session takes it back only after
// idleWatchAfter without an answer. So, whatever the load:
//   - every such call reads and writes on the caller's goroutine alone;
//   - so does every wait, grant included (the socket is lent to it, or
//     borrowed for it, however idle the session);
//   - and enough calls are such to mean something: with the socket
//     never lent (the fast path off) there are none, and the test fails.
func TestIdleSessionIOOnCallersGoroutine(t *testing.T) {
	d := env.DB(t)
	admin := adminPool(t)
	ctx := pgtest.Context(t, time.Minute)
	rec := &ioRecorder{ios: map[ioAt]int{}}
	pool := d.Pool(t, func(cfg *pgxpool.Config) {
		dial := cfg.ConnConfig.DialFunc
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return recordedConn{Conn: c, r: rec, id: rec.conns.Add(1)}, nil
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
	var (
		// lent is, by connection, when the last call that ran on the
		// caller's goroutine alone began, or for a wait a time before
		// its grant: no later than the session's idleness is counted
		// from (the sending of its last answered request). The
		// PingInterval of a minute keeps pings out of the count.
		lent     = map[int32]time.Time{}
		calls    int
		promised int      // calls that ended within idleWatchAfter of lent
		broken   []string // promised calls that read or wrote elsewhere
		mine     int      // reads and writes on the caller's goroutine
		others   int      // on other goroutines
		pgxBG    int      // by pgx's background reader
		touched  = map[int32]bool{}
	)
	// check judges the reads and writes of a call that began at start
	// and ended at end. Those on a connection in waits must be on the
	// caller's goroutine; on the others, if the call was promised it.
	check := func(what string, start, end time.Time, ios map[ioAt]int, waits map[int32]bool) {
		calls++
		require.NotEmpty(t, ios, "%s: no reads or writes recorded", what)
		type count struct{ mine, others int }
		byConn := map[int32]count{}
		for at, n := range ios {
			c := byConn[at.conn]
			switch at.g {
			case me:
				c.mine += n
				mine += n
			case 0:
				pgxBG += n
			default:
				c.others += n
				others += n
			}
			byConn[at.conn] = c
		}
		for conn, c := range byConn {
			touched[conn] = true
			if waits[conn] {
				require.Zero(t, c.others, "%s: the wait on connection %d read or wrote on another goroutine", what, conn)
				continue
			}
			if since, ok := lent[conn]; ok && end.Sub(since) < idleWatchAfter {
				promised++
				if c.others > 0 {
					broken = append(broken, fmt.Sprintf("%s on connection %d, ended %s after the start of the last call on the caller's goroutine there",
						what, conn, end.Sub(since)))
				}
			}
			if c.others == 0 {
				lent[conn] = start
			} else {
				delete(lent, conn) // the socket is lent again once the goroutine has lingered
			}
		}
	}
	// between is what the sessions read and wrote between calls: nothing
	// should, with no ping due.
	between := 0
	idleIO := func() {
		for _, n := range rec.take() {
			between += n
		}
	}
	call := func(what string, fn func()) {
		idleIO()
		start := time.Now()
		fn()
		end := time.Now()
		check(what, start, end, rec.take(), nil)
	}

	// Locks and unlocks in a row until enough were promised the caller's
	// goroutine: on a quiet machine, all but the first; under load, some
	// more rounds may be needed.
	rec.on.Store(true)
	const wantPromised, maxRounds = 40, 2000
	for i := 0; promised < wantPromised && i < maxRounds; i++ {
		var lk *advisory.Lock
		call("TryLock", func() {
			var err error
			lk, err = l.TryLock(ctx, key)
			require.NoError(t, err)
		})
		call("Unlock", func() { require.NoError(t, lk.Unlock(ctx)) })
	}
	require.GreaterOrEqual(t, promised, wantPromised,
		"of %d locks and unlocks in a row, too few came within %s of one on the caller's goroutine: does the session lend its socket?",
		calls, idleWatchAfter)

	// The connections of the locks and unlocks: the shared session's.
	shared := map[int32]bool{}
	for at := range touched {
		shared[at] = true
	}
	for round := range 3 { // a new waiting session, then a spare, twice
		held, err := other.TryLock(ctx, key)
		require.NoError(t, err)
		unlocking := make(chan time.Time, 1)
		unlocked := make(chan error, 1)
		go func() {
			eventuallyWaiting(t, admin, d, 1)
			unlocking <- time.Now() // before the grant
			unlocked <- held.Unlock(ctx)
		}()
		what := fmt.Sprintf("Lock (round %d)", round)
		idleIO()
		start := time.Now()
		lk, err := l.Lock(ctx, key)
		require.NoError(t, err)
		end := time.Now()
		// The wait's connection is any but the shared session's, which
		// the Lock of round 0 tries first.
		ios := rec.take()
		waits := map[int32]bool{}
		var waitConn int32
		for at := range ios {
			if !shared[at.conn] {
				waits[at.conn], waitConn = true, at.conn
			}
		}
		require.Len(t, waits, 1, "%s: a wait on one connection of its own", what)
		check(what, start, end, ios, waits)
		lent[waitConn] = <-unlocking
		call(fmt.Sprintf("Unlock (round %d)", round), func() { require.NoError(t, lk.Unlock(ctx)) })
		require.NoError(t, <-unlocked)
	}
	rec.on.Store(false)
	t.Logf("%d calls, %d promised the caller's goroutine; reads and writes: %d on the caller's goroutine, %d on others, %d by pgx's background reader, %d between calls",
		calls, promised, mine, others, pgxBG, between)
	require.Empty(t, broken, "calls that ended within %s of one on the caller's goroutine read or wrote on another", idleWatchAfter)
}
