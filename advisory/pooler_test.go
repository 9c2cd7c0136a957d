package advisory_test

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// stmtPooler imitates PgBouncer in transaction mode, as far as a session
// can tell: once switching is on, every statement after the server said
// ReadyForQuery outside a transaction goes to a fresh backend. It works for trust
// authentication and sslmode=disable, as the throwaway cluster has.
type stmtPooler struct {
	target string
	ln     net.Listener
	mu     sync.Mutex
	on     bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newStmtPooler(t *testing.T, target string) *stmtPooler {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &stmtPooler{target: target, ln: ln}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *stmtPooler) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *stmtPooler) switching(on bool) {
	p.mu.Lock()
	p.on = on
	p.mu.Unlock()
}

func (p *stmtPooler) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

func (p *stmtPooler) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(c)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			_ = p.serve(c)
		}()
	}
}

func readMsg(r io.Reader, typed bool) ([]byte, error) {
	n := 4
	if typed {
		n = 5
	}
	hdr := make([]byte, n)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(hdr[n-4:])
	body := make([]byte, int(size)-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	return append(hdr, body...), nil
}

// dial opens a backend with the client's startup message and swallows the
// server's greeting up to ReadyForQuery, returning it too.
func (p *stmtPooler) dial(startup []byte) (net.Conn, [][]byte, error) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return nil, nil, err
	}
	p.track(s)
	if _, err := s.Write(startup); err != nil {
		return nil, nil, err
	}
	var greeting [][]byte
	for {
		m, err := readMsg(s, true)
		if err != nil {
			return nil, nil, err
		}
		greeting = append(greeting, m)
		switch m[0] {
		case 'Z':
			return s, greeting, nil
		case 'E':
			return nil, nil, fmt.Errorf("backend refused startup")
		}
	}
}

func (p *stmtPooler) serve(client net.Conn) error {
	defer client.Close()
	startup, err := readMsg(client, false)
	if err != nil {
		return err
	}
	server, greeting, err := p.dial(startup)
	if err != nil {
		return err
	}
	for _, m := range greeting {
		if _, err := client.Write(m); err != nil {
			return err
		}
	}
	// One statement at a time: forward client messages up to Sync (or a
	// simple Query), then server messages up to ReadyForQuery; then maybe
	// switch backends.
	for {
		for {
			m, err := readMsg(client, true)
			if err != nil {
				return err
			}
			if m[0] == 'X' { // Terminate
				_ = server.Close()
				return nil
			}
			if _, err := server.Write(m); err != nil {
				return err
			}
			if m[0] == 'S' || m[0] == 'Q' {
				break
			}
		}
		idle := false
		for {
			m, err := readMsg(server, true)
			if err != nil {
				return err
			}
			if _, err := client.Write(m); err != nil {
				return err
			}
			if m[0] == 'Z' {
				idle = m[5] == 'I' // not inside a transaction
				break
			}
		}
		p.mu.Lock()
		on := p.on
		p.mu.Unlock()
		if on && idle {
			_ = server.Close()
			if server, _, err = p.dial(startup); err != nil {
				return err
			}
		}
	}
}

// Behind transaction pooling, session locks would be taken and released
// on random backends: the Locker refuses with ErrSessionPooling, at
// session setup or as soon as a statement comes back from another
// backend, and the locks on such a session count as lost.
func TestSessionPoolingDetected(t *testing.T) {
	c := env.Cluster()
	if c == nil {
		t.Skip("needs the throwaway cluster's TCP port") // only with PGBATON_TEST_DSN
	}
	d := env.DB(t)
	ctx := pgtest.Context(t, time.Minute)
	p := newStmtPooler(t, fmt.Sprintf("127.0.0.1:%d", c.Port()))
	pool := pgtest.Pool(t, d.URL, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Port = uint16(p.port())
	})

	// Switching from the start: the session setup sees two pids.
	p.switching(true)
	rec := &logRecorder{}
	l := newLocker(t, pool, advisory.Config{Logger: rec.logger()})
	_, err := l.TryLock(ctx, advisory.Int64(1))
	require.ErrorIs(t, err, advisory.ErrSessionPooling)
	rec.requireLogged(t, slog.LevelError, "refused")
	require.ErrorContains(t, err, "XactLock")

	// Switching after a session was set up: the next statement tells.
	p.switching(false)
	l2 := newLocker(t, pool, advisory.Config{})
	lk, err := l2.TryLock(ctx, advisory.Int64(2))
	require.NoError(t, err)
	p.switching(true)
	// The statement after the switch is turned on still finds the old
	// backend; the one after that does not.
	for i := range 3 {
		if _, err = l2.TryLock(ctx, advisory.Int64(int64(10+i))); err != nil {
			break
		}
	}
	require.ErrorIs(t, err, advisory.ErrSessionPooling)
	<-lk.Done()
	require.ErrorIs(t, lk.Err(), advisory.ErrLockLost)
	require.ErrorIs(t, lk.Err(), advisory.ErrSessionPooling)

	// Transaction-scoped locks are fine behind it.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, l2.XactTryLock(ctx, tx, advisory.Int64(4)))
	require.NoError(t, tx.Rollback(ctx))
}

// A server that only looks like PostgreSQL (here a protocol-level fake
// that answers like CockroachDB, whose pg_advisory_lock locks nothing) is
// refused with pgbaton.ErrUnsupportedServer before anything is locked.
func TestUnsupportedServerRefused(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	const crdb = "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27 01:53:43, go1.19.10)"
	for _, params := range []map[string]string{
		{"server_version": "13.0.0", "crdb_version": crdb},
		{"server_version": "13.0.0"}, // a proxy that hid crdb_version: version() tells
	} {
		fake := pgtest.StartFakeServer(t, crdb, params)
		rec := &logRecorder{}
		l := newLocker(t, pgtest.Pool(t, fake.URL()), advisory.Config{Logger: rec.logger()})
		_, err := l.TryLock(ctx, advisory.Int64(1))
		require.ErrorIs(t, err, pgbaton.ErrUnsupportedServer)
		require.ErrorContains(t, err, "CockroachDB")
		_, err = l.Lock(ctx, advisory.Int64(1))
		require.ErrorIs(t, err, pgbaton.ErrUnsupportedServer)
		require.ErrorIs(t, l.Check(ctx), pgbaton.ErrUnsupportedServer)
		rec.requireLogged(t, slog.LevelError, "refused")
		for _, q := range fake.Queries() {
			require.NotRegexp(t, `pg_(try_)?advisory_(xact_)?lock`, q, "no lock statement reached the server")
		}
	}
}
