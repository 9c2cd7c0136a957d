package leasetable

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/metric"
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

	// RenewInterval is how often a held lease is renewed. Default TTL/3.
	// It must be shorter than TTL - SafetyMargin, or the local deadline
	// would pass before the first renewal.
	RenewInterval time.Duration

	// SafetyMargin is taken off the TTL for the local deadline, to cover
	// clock rate differences and the time a renewal takes to be applied.
	// The holder counts the lease lost at TTL - SafetyMargin after the
	// last successful acquire or renew was sent. Default TTL/10.
	SafetyMargin time.Duration

	// Logger receives lost leases and renewal failures (Warn), reconnects
	// of the LISTEN connection (Warn when it fails, Info when it is back),
	// refusals of a standby or an unmigrated database (Error), and waits
	// (Debug). Default: silent.
	Logger *slog.Logger

	// MeterProvider receives OpenTelemetry metrics, all with attribute
	// pgbaton.layer = "lease" (the advisory package reports the same
	// names): pgbaton.acquire.attempts and pgbaton.acquire.wait.duration
	// by pgbaton.result ("acquired", "held": somebody else held it, also
	// for a wait that gave up; "error"), pgbaton.held (leases held now),
	// pgbaton.hold.duration, pgbaton.lost by pgbaton.cause (CauseExpired,
	// CauseRenew, CauseSuperseded) and pgbaton.renew.failures. Claim
	// counts one acquired attempt per lease it returns, one held attempt
	// when it returns none. Default: none (no-op).
	MeterProvider metric.MeterProvider

	// MetricNames adds the lease name (for Claim, Semaphore and Keep: the
	// group) as the attribute pgbaton.name. Off by default, because names
	// can be unbounded (one per work item) and every name makes a series.
	MetricNames bool
}

func (c Config) withDefaults() (Config, error) {
	if c.Owner == "" {
		c.Owner = defaultOwner()
	}
	if err := checkName("owner", c.Owner); err != nil {
		return c, err
	}
	if c.TTL == 0 {
		c.TTL = 15 * time.Second
	}
	if c.TTL < time.Millisecond {
		return c, invalid("TTL must be at least 1ms, got %s", c.TTL)
	}
	if c.SafetyMargin == 0 {
		c.SafetyMargin = c.TTL / 10
	}
	if c.SafetyMargin < 0 || c.SafetyMargin >= c.TTL {
		return c, invalid("SafetyMargin must be in [0, TTL), got %s with TTL %s", c.SafetyMargin, c.TTL)
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = c.TTL / 3
	}
	if c.RenewInterval <= 0 || c.RenewInterval >= c.TTL-c.SafetyMargin {
		return c, invalid("RenewInterval must be positive and shorter than TTL - SafetyMargin (%s), got %s",
			c.TTL-c.SafetyMargin, c.RenewInterval)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

func (c Config) ttlMs() int64 {
	return int64((c.TTL + time.Millisecond - 1) / time.Millisecond)
}

func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	owner := fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	if len(owner) > MaxNameLen {
		owner = owner[len(owner)-MaxNameLen:]
	}
	return owner
}

// checkName rejects what the database would refuse, before anything is
// sent: empty or oversized names, NUL bytes and invalid UTF-8.
func checkName(what, s string) error {
	switch {
	case s == "":
		return invalid("empty %s", what)
	case len(s) > MaxNameLen:
		return invalid("%s is %d bytes, at most %d allowed", what, len(s), MaxNameLen)
	case strings.IndexByte(s, 0) >= 0:
		return invalid("%s contains a NUL byte", what)
	case !utf8.ValidString(s):
		return invalid("%s is not valid UTF-8", what)
	}
	return nil
}
