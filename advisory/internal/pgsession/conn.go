package pgsession

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/serverkind"
)

// Config is what a Conn needs of its Locker's configuration.
type Config struct {
	Pool          *pgxpool.Pool
	PingInterval  time.Duration
	PingTimeout   time.Duration
	SessionPooler bool   // see advisory.Config.SessionPooler
	AppName       string // application_name of every connection
	Logger        *slog.Logger
	Stats         *Counters
	// PingsFailed is told how many pings went down with a failed batch:
	// the connection's renew failures.
	PingsFailed func(n int)
}

// Counters count what every Conn of a Locker does, for its Stats.
type Counters struct {
	Batches, Requests, Pipelined, Connects atomic.Int64
}

// Open takes a connection out of cfg.Pool for good (Hijack: the pool
// forgets it, so MaxConnLifetime and health checks never touch it),
// refuses it if it cannot hold session locks safely (server kind,
// standby, pooler: see setupConn), and readies it: TCP settings,
// application_name and token set, statements prepared (see ready).
// The Conn's goroutine runs until Shutdown, Retire or a failure.
func Open(ctx context.Context, cfg *Config) (*Conn, error) {
	cfg.Stats.Connects.Add(1)
	pc, err := cfg.Pool.Acquire(ctx)
	if err != nil {
		return nil, MapError("open session", err)
	}
	conn := pc.Hijack()
	s, err := setupConn(ctx, cfg, conn)
	if err != nil {
		closeConn(conn)
		return nil, err
	}
	s.start()
	return s, nil
}

// setupConn refuses a connection that cannot hold session locks safely,
// before anything is changed on its backend, and readies the others.
func setupConn(ctx context.Context, cfg *Config, conn *pgx.Conn) (*Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.PingTimeout)
	defer cancel()
	if k := serverkind.FromParams(conn); k != serverkind.PostgreSQL {
		return nil, fmt.Errorf("advisory: %w", k.Err(conn.PgConn().ParameterStatus("crdb_version")))
	}
	row, err := db.New().AdvisorySessionProbe(ctx, simpleProtocol{conn})
	if err != nil {
		// A server that only looks like PostgreSQL may not know what the
		// probe asks: say what it is rather than what it did not know.
		if kerr := serverkind.CheckConn(ctx, conn); errors.Is(kerr, pgbaton.ErrUnsupportedServer) {
			return nil, fmt.Errorf("advisory: %w", kerr)
		}
		return nil, MapError("set up session", err)
	}
	if err := serverkind.Classify(row.Version, conn.PgConn().ParameterStatus).Err(row.Version); err != nil {
		return nil, fmt.Errorf("advisory: %w", err)
	}
	if row.InRecovery {
		return nil, fmt.Errorf("advisory: %w", pgbaton.ErrStandby)
	}
	if conn.PgConn().PID() != uint32(row.Pid) && !cfg.SessionPooler {
		// The cancel key the server sent at startup is not the backend's:
		// a pooler made it up, as it must when one client connection may
		// be served by many backends. Whether this one lends backends per
		// transaction cannot be told for sure from a client, so only a
		// pooler declared to run in session mode is used.
		return nil, fmt.Errorf("%w (a pooler is in between: its cancel key %d is not backend %d; if it runs in session mode, set Config.SessionPooler)",
			ErrSessionPooling, conn.PgConn().PID(), row.Pid)
	}
	isDirect := direct(conn, row)
	if !isDirect {
		if err := checkProxy(ctx, cfg.Pool, conn, row); err != nil {
			return nil, err
		}
	}
	s := &Conn{cfg: cfg, conn: conn, pid: row.Pid, token: newToken()}
	s.names = NamesFor(s.token)
	if err := s.ready(ctx, isDirect); err != nil {
		return nil, err
	}
	return s, nil
}

// direct reports whether the connection demonstrably reaches its backend
// with nothing in between, so that the backend is this connection's
// alone. Two things must agree with what the backend says of itself: the
// process id the server sent at startup (for cancel requests; a pooler
// such as PgBouncer sends one of its own, as one client connection maps to
// many backends), and, over TCP, the client address and port the server
// sees, which must be this socket's own (any proxy, NAT aside, shows its
// own). Over a unix socket the first has to do.
func direct(conn *pgx.Conn, row db.AdvisorySessionProbeRow) bool {
	if conn.PgConn().PID() != uint32(row.Pid) {
		return false
	}
	switch local := conn.PgConn().Conn().LocalAddr().(type) {
	case *net.UnixAddr:
		return row.ClientPort == -1 // the server sees a unix socket too
	case *net.TCPAddr:
		ip := net.ParseIP(row.ClientAddr)
		return ip != nil && ip.Equal(local.IP) && int(row.ClientPort) == local.Port
	}
	return false
}

// proxyRounds is how many times checkProxy looks for a shared backend.
const proxyRounds = 5

// checkProxy tells a proxy that gives each client connection a backend of
// its own (a session-mode pooler, a TCP proxy) from one that lends
// backends per transaction or statement, which would take and release
// session locks on backends other clients use. Three signs, looked for a
// few times over, before anything is set on the backend:
//
//   - the backend already holds advisory locks: another client's, on a
//     backend shared with it;
//   - the session's next statement runs on another backend;
//   - a second client connection, asked right after the session's
//     statement, is served by the session's backend. A transaction pooler
//     hands out the server connection released last (PgBouncer's default
//     is LIFO), so with no other traffic it is always caught this way;
//     under traffic the session's own statements move instead.
//
// A pooler that slips through all three still cannot make two sessions
// share locks: every session statement checks the backend's token, which
// the last session set up there owns (queries/advisory.sql).
func checkProxy(ctx context.Context, pool *pgxpool.Pool, conn *pgx.Conn, row db.AdvisorySessionProbeRow) error {
	if row.AdvisoryLocks > 0 {
		return fmt.Errorf("%w (backend %d already holds %d advisory locks of another client)", ErrSessionPooling, row.Pid, row.AdvisoryLocks)
	}
	probe, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("advisory: a proxy is in between, and no second connection could be had to check that it does not pool transactions: %w", err)
	}
	defer probe.Release()
	q := db.New()
	for range proxyRounds {
		pid, err := q.AdvisoryBackendPID(ctx, simpleProtocol{conn})
		if err != nil {
			return MapError("set up session", err)
		}
		if pid != row.Pid {
			return fmt.Errorf("%w (pids %d then %d)", ErrSessionPooling, row.Pid, pid)
		}
		other, err := q.AdvisoryBackendPID(ctx, simpleProtocol{probe.Conn()})
		if err != nil {
			return MapError("set up session", err)
		}
		if other == row.Pid {
			return fmt.Errorf("%w (two client connections were served by backend %d)", ErrSessionPooling, row.Pid)
		}
	}
	return nil
}

// newToken is a random session token: 128 bits in hex.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// simpleProtocol runs the generated queries with the simple protocol: no
// statement is prepared on the backend, so a pooler can neither refuse it
// nor mix it up with another client's (pgx names its cached statements
// after their text, so two clients on one backend would collide with
// "prepared statement already exists").
type simpleProtocol struct{ c *pgx.Conn }

func (s simpleProtocol) args(args []any) []any {
	return append([]any{pgx.QueryExecModeSimpleProtocol}, args...)
}

func (s simpleProtocol) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return s.c.Exec(ctx, sql, s.args(args)...)
}

func (s simpleProtocol) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return s.c.Query(ctx, sql, s.args(args)...)
}

func (s simpleProtocol) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return s.c.QueryRow(ctx, sql, s.args(args)...)
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// giveUp is how long after its last answer a connection is declared lost.
func (c *Config) giveUp() time.Duration { return c.PingInterval + c.PingTimeout }

// serverTimeouts are the TCP settings of every connection, derived from
// giveUp so that the server drops a silent client only well after the
// client has given up. With g = giveUp (PingInterval + PingTimeout):
//
//	tcp_keepalives_idle     = ceil(g + 1s)    seconds of silence before probing
//	tcp_keepalives_interval = 1s
//	tcp_keepalives_count    = enough probes to reach tcp_user_timeout
//	tcp_user_timeout        = 2g + 1s         unacknowledged data or probes before the drop
//
// The client declares a connection lost at most g after the last moment
// the server demonstrably heard from it (the send time of the last
// answered round trip). A silently partitioned client (no FIN, no RST) is
// pinged by no one: its backend first probes after g + 1s of silence and
// drops the connection only after 2g + 1s, by which time the client has
// been reporting the loss for g + 1s. If the partition is one-way and the
// client's pings still reach the server, the server's answers go
// unacknowledged and tcp_user_timeout (2g + 1s from the first unanswered
// one, which is later than the client's last answer) drops it, again
// after the client gave up. A crashed client host is the same as a
// partition; a crashed client process closes its sockets and its locks
// are freed at once, which is the point of session locks. Over a unix
// socket these settings do not apply and are not needed.
type serverTimeouts struct {
	keepalivesIdle     int // seconds
	keepalivesInterval int // seconds
	keepalivesCount    int
	userTimeout        int // milliseconds
}

func (c *Config) serverTimeouts() serverTimeouts {
	g := c.giveUp()
	user := 2*g + time.Second
	idle := int(math.Ceil((g + time.Second).Seconds()))
	count := max(1, int(math.Ceil((user.Seconds()-float64(idle))/1)))
	return serverTimeouts{
		keepalivesIdle:     idle,
		keepalivesInterval: 1,
		keepalivesCount:    count,
		userTimeout:        int(user.Milliseconds()),
	}
}
