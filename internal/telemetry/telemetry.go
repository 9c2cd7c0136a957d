// Package telemetry holds the OpenTelemetry instruments the lock layers
// share, so that advisory and leasetable report the same metric names with
// the same attributes. Without a MeterProvider every instrument is a no-op.
//
// Cardinality is bounded: attributes are the layer, the result or cause (a
// few fixed values), and the lock name only when the user asks for it.
package telemetry

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// ScopeName is the instrumentation scope of every pgbaton instrument.
const ScopeName = "github.com/pgbaton/pgbaton"

// Results of an acquire attempt.
const (
	Acquired = "acquired" // granted
	Held     = "held"     // somebody else holds it (contention)
	Error    = "error"    // failed for another reason
)

// Config selects where metrics go.
type Config struct {
	// MeterProvider receives the metrics. Default: none (no-op).
	MeterProvider metric.MeterProvider
	// WithNames adds the lock name as an attribute. Off by default: names
	// can be unbounded (one per work item).
	WithNames bool
}

// Instruments records the metrics of one layer ("advisory", "lease").
type Instruments struct {
	layer     attribute.KeyValue
	withNames bool

	attempts      metric.Int64Counter
	waitDuration  metric.Float64Histogram
	holdDuration  metric.Float64Histogram
	renewFailures metric.Int64Counter
	lost          metric.Int64Counter
	held          metric.Int64UpDownCounter
	sessions      metric.Int64UpDownCounter
}

// New creates the instruments of layer. It never fails: an instrument the
// provider refuses is replaced by a no-op one.
func New(layer string, cfg Config) *Instruments {
	mp := cfg.MeterProvider
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter(ScopeName)
	noopM := noop.NewMeterProvider().Meter(ScopeName)
	i := &Instruments{layer: attribute.String("pgbaton.layer", layer), withNames: cfg.WithNames}
	var err error
	if i.attempts, err = m.Int64Counter("pgbaton.acquire.attempts",
		metric.WithDescription("Acquire attempts by result: acquired, held (contention), error."),
		metric.WithUnit("{attempt}")); err != nil {
		i.attempts, _ = noopM.Int64Counter("")
	}
	if i.waitDuration, err = m.Float64Histogram("pgbaton.acquire.wait.duration",
		metric.WithDescription("Time from asking for a lock or lease to holding it or giving up."),
		metric.WithUnit("s")); err != nil {
		i.waitDuration, _ = noopM.Float64Histogram("")
	}
	if i.holdDuration, err = m.Float64Histogram("pgbaton.hold.duration",
		metric.WithDescription("How long a lock or lease was held, until release or loss."),
		metric.WithUnit("s")); err != nil {
		i.holdDuration, _ = noopM.Float64Histogram("")
	}
	if i.renewFailures, err = m.Int64Counter("pgbaton.renew.failures",
		metric.WithDescription("Lease renewals or session pings that failed."),
		metric.WithUnit("{failure}")); err != nil {
		i.renewFailures, _ = noopM.Int64Counter("")
	}
	if i.lost, err = m.Int64Counter("pgbaton.lost",
		metric.WithDescription("Locks and leases lost, by cause."),
		metric.WithUnit("{lock}")); err != nil {
		i.lost, _ = noopM.Int64Counter("")
	}
	if i.held, err = m.Int64UpDownCounter("pgbaton.held",
		metric.WithDescription("Locks and leases held now by this process."),
		metric.WithUnit("{lock}")); err != nil {
		i.held, _ = noopM.Int64UpDownCounter("")
	}
	if i.sessions, err = m.Int64UpDownCounter("pgbaton.sessions",
		metric.WithDescription("Session connections open for advisory locks."),
		metric.WithUnit("{session}")); err != nil {
		i.sessions, _ = noopM.Int64UpDownCounter("")
	}
	return i
}

func (i *Instruments) attrs(name string, extra ...attribute.KeyValue) metric.MeasurementOption {
	kv := append([]attribute.KeyValue{i.layer}, extra...)
	if i.withNames && name != "" {
		kv = append(kv, attribute.String("pgbaton.name", name))
	}
	return metric.WithAttributes(kv...)
}

// Attempt records one acquire attempt of name with its result and how long
// it took, including any wait.
func (i *Instruments) Attempt(ctx context.Context, name, result string, took time.Duration) {
	opt := i.attrs(name, attribute.String("pgbaton.result", result))
	i.attempts.Add(ctx, 1, opt)
	i.waitDuration.Record(ctx, took.Seconds(), opt)
	if result == Acquired {
		i.held.Add(ctx, 1, i.attrs(name))
	}
}

// Ended records the end of a hold of name that lasted held; cause is ""
// for a normal release, else why it was lost ("session", "expired",
// "renew", "superseded", ...).
func (i *Instruments) Ended(ctx context.Context, name string, held time.Duration, cause string) {
	i.held.Add(ctx, -1, i.attrs(name))
	i.holdDuration.Record(ctx, held.Seconds(), i.attrs(name))
	if cause != "" {
		i.lost.Add(ctx, 1, i.attrs(name, attribute.String("pgbaton.cause", cause)))
	}
}

// RenewFailed records a failed renewal or ping.
func (i *Instruments) RenewFailed(ctx context.Context, name string) {
	i.renewFailures.Add(ctx, 1, i.attrs(name))
}

// SessionOpened and SessionClosed track advisory session connections.
func (i *Instruments) SessionOpened(ctx context.Context) { i.sessions.Add(ctx, 1, i.attrs("")) }

// SessionClosed is SessionOpened's counterpart.
func (i *Instruments) SessionClosed(ctx context.Context) { i.sessions.Add(ctx, -1, i.attrs("")) }
