package telemetry

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Span attributes besides error.type. db.system.name is the database
// conventions' (the spans are a client's calls to PostgreSQL, waits
// included); the others are pgbaton's, the ones an operator filters on.
const (
	DBSystemKey = "db.system.name"  // always "postgresql"
	LayerKey    = "pgbaton.layer"   // advisory, lease, fencedwrite
	NameKey     = "pgbaton.name"    // the lock, lease or election name
	GroupKey    = "pgbaton.group"   // a claim's group
	OwnerKey    = "pgbaton.owner"   // the client's Config.Owner
	TokenKey    = "pgbaton.token"   // the fencing token granted or used
	OutcomeKey  = "pgbaton.outcome" // acquired, held, grace, error; lost, released, ...
	WaitKey     = "pgbaton.wait.seconds"
	CountKey    = "pgbaton.count"   // items claimed or completed
	SessionKey  = "pgbaton.session" // a lease keep-alive's session id
)

// Outcomes of spans besides an attempt's results (Acquired, Held, Error).
const (
	None    = "none"    // a claim that found nothing free
	done    = "done"    // completed
	alive   = "alive"   // a keep-alive that kept the session
	expired = "expired" // a keep-alive that found the session gone
)

var postgres = attribute.String(DBSystemKey, "postgresql")

// Tracer starts pgbaton's spans. Made without a TracerProvider it starts
// none: Start then returns a span that records nothing, allocated
// nowhere, and callers skip their attributes (Span.IsRecording), so the
// hot path pays nothing (TestTracerOffAllocatesNothing).
type Tracer struct{ t trace.Tracer }

// NewTracer is a Tracer on tp; nil and OpenTelemetry's no-op provider turn
// tracing off.
func NewTracer(tp trace.TracerProvider) Tracer {
	if _, off := tp.(noop.TracerProvider); off || tp == nil {
		return Tracer{}
	}
	return Tracer{t: tp.Tracer(ScopeName)}
}

// On reports whether tr starts spans (it was made with a TracerProvider).
func (tr Tracer) On() bool { return tr.t != nil }

// FromContext is a Tracer on the provider of ctx's span when that span
// records: for calls without a Config of their own (fencedwrite.InTx),
// which trace only inside a caller's trace.
func FromContext(ctx context.Context) Tracer {
	s := trace.SpanFromContext(ctx)
	if !s.IsRecording() {
		return Tracer{}
	}
	return NewTracer(s.TracerProvider())
}

// Start starts span name (e.g. "pgbaton.lease.acquire") as a client span
// under ctx's, with the layer and db.system.name set.
func (tr Tracer) Start(ctx context.Context, name, layer string) (context.Context, trace.Span) {
	if tr.t == nil {
		return ctx, noop.Span{}
	}
	return tr.t.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(postgres, attribute.String(LayerKey, layer)))
}

// End ends span with outcome, recording err (its error.type and status)
// when there is one. Callers set their attributes first, only when
// span.IsRecording().
func End(span trace.Span, outcome string, err error) {
	if !span.IsRecording() {
		return
	}
	if outcome != "" {
		span.SetAttributes(attribute.String(OutcomeKey, outcome))
	}
	if err != nil {
		span.SetAttributes(attribute.String(ErrorTypeKey, ErrorType(err)))
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// Waited is the wait attribute: how long a call waited for a holder.
func Waited(d time.Duration) attribute.KeyValue { return attribute.Float64(WaitKey, d.Seconds()) }

// EndGrant ends span, of a call by owner on name (under key: a lease,
// semaphore or group) that began at start, with outcome: Acquired (count
// granted; token, the grant's, is set when count is 1), None (nothing
// free), Held or Error (err). The caller tells Held from Error by its own
// errors.
func EndGrant(span trace.Span, key attribute.Key, name, owner string, start time.Time, count int, token int64, outcome string, err error) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String(string(key), name), attribute.String(OwnerKey, owner),
		Waited(time.Since(start)), attribute.Int(CountKey, count))
	if outcome == Acquired && count == 1 {
		span.SetAttributes(attribute.Int64(TokenKey, token))
	}
	End(span, outcome, err)
}

// EndComplete ends span, of a completion by owner of count leases.
func EndComplete(span trace.Span, owner string, count int, err error) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String(OwnerKey, owner), attribute.Int(CountKey, count))
	End(span, done, err)
}

// EndKeepalive ends span, of a keep-alive by owner of session id carrying
// count leases, that found the session alive or not, or failed with err.
func EndKeepalive(span trace.Span, owner string, id int64, count int, isAlive bool, err error) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String(OwnerKey, owner), attribute.Int64(SessionKey, id), attribute.Int(CountKey, count))
	outcome := alive
	switch {
	case err != nil:
		outcome = Error
	case !isAlive:
		outcome = expired
	}
	End(span, outcome, err)
}
