package leasetable

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgbaton/pgbaton/internal/listener"
	"github.com/pgbaton/pgbaton/internal/names"
	"github.com/pgbaton/pgbaton/internal/session"
)

// MaxNameLen is the longest lease name, group, job or owner, in bytes.
const MaxNameLen = 255

// Config configures a Client. The zero value is usable: every field has a
// documented default.
type Config struct {
	// Owner identifies this client in the lease table. Default
	// "hostname:pid:random", unique per Client. At most MaxNameLen bytes.
	Owner string

	// TTL is how long a grant lasts without renewal, by the database
	// clock. Sent as whole milliseconds (rounded up). Default 15s.
	TTL time.Duration

	// RenewInterval is how often the client's session is kept alive, one
	// statement for all its leases, from RenewInterval after the oldest was
	// granted (else every TTL - SafetyMargin - RenewInterval, 8.5s by
	// default, so that it does not lapse). Default TTL/3. It must be
	// shorter than TTL - SafetyMargin, or the local deadline would pass
	// before the first keep-alive.
	RenewInterval time.Duration

	// SafetyMargin is taken off the TTL for the local deadline, to cover
	// clock rate differences and the time a renewal takes to be applied.
	// The holder counts the lease lost at TTL - SafetyMargin after the
	// last successful acquire or renew was sent. A forward step of the
	// database's clock by more than it is reported at the next keep-alive
	// (ErrClockStep). Default TTL/10.
	SafetyMargin time.Duration

	// Logger receives lost leases and sessions, keep-alive failures,
	// forward steps of the database's clock and LISTEN connection failures
	// (Warn; Info when it is back), refusals of a standby or an unmigrated
	// database (Error), and waits (Debug). Default: silent.
	Logger *slog.Logger

	// MeterProvider receives OpenTelemetry metrics, all with attribute
	// pgbaton.layer = "lease", under the names package advisory uses, plus
	// pgbaton.clock.steps; docs/operating.md lists them. Claim counts one
	// acquired attempt per lease it returns, one held attempt when it
	// returns none. Default: none (no-op).
	MeterProvider metric.MeterProvider

	// TracerProvider receives an OpenTelemetry span for each call that
	// waits or touches the database (Acquire, TryAcquire, Semaphore,
	// TrySemaphore; Claim, ClaimWait, CompleteAndClaim; Complete,
	// CompleteTx) under the caller's span, and for each keep-alive of the
	// lease session; the package documentation lists their attributes.
	// Default: none; then no span is started and the call paths allocate
	// nothing for tracing.
	TracerProvider trace.TracerProvider

	// MetricNames adds the lease name (for Claim, Semaphore and Keep: the
	// group) as the attribute pgbaton.name. Off by default, because names
	// can be unbounded (one per work item) and every name makes a series.
	MetricNames bool

	// ListenDSN, when set, is the connection string of the client's
	// LISTEN connection, which waiters wake on when a lease is released.
	// By default it is opened with the pool's settings; behind a
	// transaction pooler (PgBouncer pool_mode=transaction, Supavisor, RDS
	// Proxy) notifications are not delivered on it, so point ListenDSN at
	// the server itself (or at a session-mode pool).
	ListenDSN string

	// NoListen makes waiters poll instead of listening: no connection is
	// held for notifications, and a waiter looks again at the holder's
	// known expiry, at most every PollInterval. For fleets where
	// connections are scarce. When the LISTEN connection does not deliver
	// notifications (a transaction pooler and no ListenDSN), the client
	// falls back to the same polling by itself.
	NoListen bool

	// PollInterval bounds how long a waiter sleeps between looks when
	// notifications are not used (NoListen, or not delivered). Default 1s.
	PollInterval time.Duration

	// ListenSlots is how many clients of the database may listen at once,
	// default 16; give every client the same value. A slot is a session
	// advisory lock on the client's LISTEN connection; docs/production.md
	// says when a client takes and frees one, and how the waiters of a
	// client without one poll.
	ListenSlots int

	// Retention says how long the rows of leasetable's tables that pile
	// up with use (waiter registrations, unused named leases, dead
	// sessions) are kept, and how this client prunes them in the
	// background: once per Retention.Interval one client of all those
	// sharing the database takes the lease RetentionLease and deletes old
	// rows in small batches. The zero value prunes with the documented
	// defaults. The other tables are package retention's.
	Retention Retention

	// LockDelay is the lock-delay of the leases this client takes by name
	// (Acquire, TryAcquire, elections): when one is lost rather than
	// released (it expires, its holder is paused or cut off past it, the
	// database's clock steps, a failover loses it, or an operator
	// force-releases it without clearing the delay), nobody is granted it
	// again before LockDelay has passed after its expiry; a Release or
	// Complete frees it at once. For resources that cannot check a
	// fencing token: it gives a lost holder's writes in flight time to
	// land. Waiters wait through it (HeldError.LockDelay). Claim, ClaimWait
	// and semaphores grant without one. At most MaxLockDelay; rounded up
	// to whole milliseconds. Default 0: none, as before it existed.
	LockDelay time.Duration

	// ReleaseTimeout bounds how long a release or completion may take
	// once the caller's context has ended, or when it has none (see the
	// package doc, Cancellation and cleanup). Default 5s.
	ReleaseTimeout time.Duration
}

func (c Config) withDefaults() (Config, error) {
	if c.Owner == "" {
		c.Owner = names.Owner(MaxNameLen)
	}
	if err := checkName("owner", c.Owner); err != nil {
		return c, err
	}
	if p := session.Timing(&c.TTL, &c.SafetyMargin, &c.RenewInterval); p != "" {
		return c, invalid("%s", p)
	}
	if p := listener.Settings(&c.PollInterval, &c.ListenSlots, c.NoListen, c.ListenDSN); p != "" {
		return c, invalid("%s", p)
	}
	r, err := c.Retention.withDefaults()
	if err != nil {
		return c, err
	}
	c.Retention = r
	if c.LockDelay < 0 || c.LockDelay > MaxLockDelay { // the database refuses it
		return c, invalid("LockDelay must be 0 to %s, got %s", MaxLockDelay, c.LockDelay)
	}
	orDefault(&c.ReleaseTimeout, 5*time.Second)
	if c.ReleaseTimeout < 0 {
		return c, invalid("ReleaseTimeout must be positive, got %s", c.ReleaseTimeout)
	}
	orDefault(&c.Logger, slog.New(slog.DiscardHandler))
	return c, nil
}

// orDefault sets *v to def if it is the zero value.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

func (c Config) ttlMs() int64 { return ceilMs(c.TTL) }

// ceilMs is d in whole milliseconds, rounded up.
func ceilMs(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// checkName rejects what the database would refuse, before anything is
// sent: empty or oversized names, NUL bytes and invalid UTF-8.
func checkName(what, s string) error {
	if p := names.Problem(what, s, MaxNameLen); p != "" {
		return invalid("%s", p)
	}
	return nil
}
