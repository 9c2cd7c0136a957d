package advisory

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgbaton/pgbaton"
)

// Config configures a Locker. The zero value is valid: every field has a
// documented default.
type Config struct {
	// Namespace is prefixed to every Name key ("namespace/name" is hashed),
	// so that applications sharing a database cannot collide by accident.
	// At most MaxNamespaceLen bytes, no "/". Default "" (none).
	Namespace string

	// Owner identifies this process on the server: every connection the
	// Locker holds locks or waits on carries the application_name
	// "pgbaton advisory <Owner>" (cut to the 63 bytes Postgres keeps), so
	// pg_stat_activity and `pgbaton locks` show which process holds which
	// lock. Printable ASCII, at most MaxOwnerLen bytes. Default
	// "hostname:pid".
	Owner string

	// SessionPooler declares that the pool connects through a pooler in
	// session mode (PgBouncer pool_mode = session, with its default
	// server_reset_query DISCARD ALL, which releases a client's session
	// locks when it leaves). A pooler shows itself by the cancel key it
	// sends (its own, not the backend's), but not whether it lends
	// backends per transaction, which would spread session locks over
	// backends other clients use: without SessionPooler a Locker refuses
	// any pooler with ErrSessionPooling. With it, the Locker still checks
	// at every connection that no other client shares the backend, and
	// every statement checks that it runs on the session's own backend.
	// Default false.
	SessionPooler bool

	// MaxLocksPerSession caps the locks held on one session connection;
	// beyond it the Locker opens another session. Every statement on a
	// connection gets slower with the number of locks it holds, so many
	// locks are better spread. Default 500.
	MaxLocksPerSession int

	// MaxSessionsUnderLoad is how many session connections with room a
	// Locker spreads concurrent lock calls over. Requests on one session
	// are pipelined, but its backend runs them one after another; when a
	// session has several requests pending, new lock calls go to another
	// session, which opens (in the background) up to this many. Idle
	// sessions are kept up to this many until Close (or until lost), so
	// that a lull does not close a session the next burst reopens. Locks
	// stay on the session that took them. 1 keeps everything on one
	// session (plus one per MaxLocksPerSession locks). Default 2.
	MaxSessionsUnderLoad int

	// MaxLocks caps the locks the whole Locker holds. Past it, lock calls
	// fail with ErrLockTableFull before the server's shared lock table (by
	// default about 64 × max_connections entries for the whole server)
	// fills up and stops every other client too. Default 4000.
	MaxLocks int

	// PingInterval is how often an idle session is pinged. Default 1s.
	PingInterval time.Duration

	// PingTimeout bounds every round trip on a session, pings included. A
	// session that does not answer in time is declared lost: its locks are
	// cancelled with ErrLockLost at most PingInterval + PingTimeout after
	// the last answer the session gave. Default 2s.
	PingTimeout time.Duration

	// RetryDelay is how long Campaign waits before campaigning again after
	// an error other than the end of its context. Jittered ±25%.
	// Default 1s.
	RetryDelay time.Duration

	// Logger receives session events: lost sessions (Warn), refusals
	// such as a standby, a transaction pooler or a full lock table
	// (Error or Warn), a session opened again after a loss (Info), and
	// sessions opened and closed (Debug). Default: silent.
	Logger *slog.Logger

	// MeterProvider receives the Locker's OpenTelemetry metrics (listed
	// in the package documentation): acquire attempts by result, wait and hold durations, locks
	// lost by cause, failed pings, sessions and locks per session.
	// Default: none; then, as with OpenTelemetry's no-op provider,
	// nothing is recorded and the lock path does no extra work.
	MeterProvider metric.MeterProvider

	// TracerProvider receives an OpenTelemetry span for each TryLock,
	// Lock, TryRLock and RLock, waits included (see the package
	// documentation). Default: none; then no span is started and the lock
	// path allocates nothing for tracing.
	TracerProvider trace.TracerProvider

	// MetricNames adds the lock name as the pgbaton.name attribute of
	// lock metrics (the decimal key for Int64 keys, "hi,lo" for Pair).
	// Off by default: one series per name can be unbounded when names are
	// per work item.
	MetricNames bool
}

// MaxOwnerLen is the longest Config.Owner.
const MaxOwnerLen = 128

// Defaults.
const (
	DefaultMaxLocksPerSession   = 500
	DefaultMaxLocks             = 4000
	DefaultMaxSessionsUnderLoad = 2
	DefaultPingInterval         = time.Second
	DefaultPingTimeout          = 2 * time.Second
	DefaultRetryDelay           = time.Second
)

func (c Config) withDefaults() (Config, error) {
	if err := validateNamespace(c.Namespace); err != nil {
		return c, err
	}
	if c.Owner == "" {
		c.Owner = defaultOwner()
	}
	if len(c.Owner) > MaxOwnerLen || strings.IndexFunc(c.Owner, func(r rune) bool { return r < ' ' || r > '~' }) >= 0 {
		return c, fmt.Errorf("%w: Config.Owner must be printable ASCII of at most %d bytes", pgbaton.ErrInvalidArgument, MaxOwnerLen)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"PingInterval", c.PingInterval}, {"PingTimeout", c.PingTimeout}, {"RetryDelay", c.RetryDelay}} {
		if d.v < 0 {
			return c, fmt.Errorf("%w: Config.%s is negative (%s)", pgbaton.ErrInvalidArgument, d.name, d.v)
		}
	}
	if c.MaxLocksPerSession < 0 || c.MaxLocks < 0 || c.MaxSessionsUnderLoad < 0 {
		return c, fmt.Errorf("%w: Config.MaxLocksPerSession, MaxLocks and MaxSessionsUnderLoad must not be negative", pgbaton.ErrInvalidArgument)
	}
	if c.MaxSessionsUnderLoad == 0 {
		c.MaxSessionsUnderLoad = DefaultMaxSessionsUnderLoad
	}
	if c.MaxLocksPerSession == 0 {
		c.MaxLocksPerSession = DefaultMaxLocksPerSession
	}
	if c.MaxLocks == 0 {
		c.MaxLocks = DefaultMaxLocks
	}
	if c.PingInterval == 0 {
		c.PingInterval = DefaultPingInterval
	}
	if c.PingTimeout == 0 {
		c.PingTimeout = DefaultPingTimeout
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.PingInterval < 10*time.Millisecond || c.PingTimeout < 10*time.Millisecond {
		return c, fmt.Errorf("%w: Config.PingInterval and PingTimeout must be at least 10ms", pgbaton.ErrInvalidArgument)
	}
	if c.PingInterval+c.PingTimeout > time.Hour {
		return c, fmt.Errorf("%w: Config.PingInterval + PingTimeout must be at most an hour", pgbaton.ErrInvalidArgument)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// defaultOwner is "hostname:pid".
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	owner := fmt.Sprintf("%s:%d", host, os.Getpid())
	if strings.IndexFunc(owner, func(r rune) bool { return r < ' ' || r > '~' }) >= 0 {
		owner = fmt.Sprintf("pid:%d", os.Getpid())
	}
	return owner
}
