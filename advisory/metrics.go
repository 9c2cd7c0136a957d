package advisory

import (
	"context"
	"errors"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// Causes of a lost lock, the pgbaton.cause attribute of pgbaton.lost.
const (
	// CauseSession: the session connection holding the lock failed, its
	// backend was terminated, or it went unanswered for longer than
	// PingInterval + PingTimeout.
	CauseSession = "session"
	// CausePooling: the session turned out to run behind a
	// transaction-pooling proxy (ErrSessionPooling).
	CausePooling = "pooling"
	// CauseClosed: the Locker was closed while the lock was held.
	CauseClosed = "closed"
)

// metrics records the Locker's instruments. Without a MeterProvider (or
// with OpenTelemetry's no-op one) it is off, and every method returns before doing anything, so that the hot
// path pays for no attribute sets nor clock reads.
type metrics struct {
	on        bool
	withNames bool
	tel       *telemetry.Instruments
}

// newMetrics makes the instruments. Locks per session is not a gauge of
// its own: several Lockers may share a MeterProvider, and their gauges
// would overwrite each other; pgbaton.held / pgbaton.sessions (layer
// advisory) gives it across all of them.
func newMetrics(cfg Config) metrics {
	if _, noop := cfg.MeterProvider.(noop.MeterProvider); noop || cfg.MeterProvider == nil {
		return metrics{}
	}
	return metrics{
		on:        true,
		withNames: cfg.MetricNames,
		tel:       telemetry.New("advisory", telemetry.Config{MeterProvider: cfg.MeterProvider, WithNames: cfg.MetricNames}),
	}
}

// name is the pgbaton.name attribute of key: "" unless Config.MetricNames
// (the telemetry package leaves "" out); the name for Name keys, the
// decimal key for Int64, "hi,lo" for Pair.
func (m *metrics) name(key Key) string {
	if !m.withNames {
		return ""
	}
	return keyName(key)
}

// keyName is key as the pgbaton.name attribute shows it.
func keyName(key Key) string {
	switch key.kind {
	case kindName:
		return key.name
	case kindInt64:
		return strconv.FormatInt(key.id, 10)
	case kindPair:
		return strconv.FormatInt(int64(key.hi), 10) + "," + strconv.FormatInt(int64(key.lo), 10)
	}
	return ""
}

// start is the time an acquire began; zero when metrics are off.
func (m *metrics) start() time.Time {
	if !m.on {
		return time.Time{}
	}
	return time.Now()
}

// attempt records the outcome of an acquire that began at start. Bad
// input and a closed Locker are not attempts and are not recorded.
// contended tells a wait that ran out (held) from other failures.
func (m *metrics) attempt(key Key, start time.Time, err error, contended bool) {
	if !m.on {
		return
	}
	switch r := result(err, contended); r {
	case "":
	case telemetry.Error:
		m.tel.AttemptFailed(context.Background(), m.name(key), err, time.Since(start))
	default:
		m.tel.Attempt(context.Background(), m.name(key), r, time.Since(start))
	}
}

// result is what came of an acquire that returned err: acquired, held
// (found held: ErrLocked, or a wait that ran out) or error; "" for bad
// input and a closed Locker, which are not attempts.
func result(err error, contended bool) string {
	switch {
	case err == nil:
		return telemetry.Acquired
	case errors.Is(err, pgbaton.ErrInvalidArgument), errors.Is(err, pgbaton.ErrClosed):
		return ""
	case errors.Is(err, ErrLocked), contended:
		return telemetry.Held
	}
	return telemetry.Error
}

// ended records the end of lk's hold; cause is "" for Unlock. Called with
// l.mu held, once per Lock (guarded by lk.ended).
func (m *metrics) ended(lk *Lock, cause string) {
	if !m.on || lk.ended {
		return
	}
	lk.ended = true
	m.tel.Ended(context.Background(), m.name(lk.key), time.Since(lk.grantedAt), cause)
}

func (m *metrics) renewFailed(n int) {
	if !m.on {
		return
	}
	for range n {
		m.tel.RenewFailed(context.Background(), "", nil) // no error at hand here: no error.type
	}
}

func (m *metrics) sessionOpened() {
	if m.on {
		m.tel.SessionOpened(context.Background())
	}
}

func (m *metrics) sessionClosed() {
	if m.on {
		m.tel.SessionClosed(context.Background())
	}
}

// lossCause is the pgbaton.cause of locks lost with a session that ended
// with err.
func lossCause(err error) string {
	switch {
	case errors.Is(err, pgbaton.ErrClosed):
		return CauseClosed
	case errors.Is(err, ErrSessionPooling):
		return CausePooling
	}
	return CauseSession
}
