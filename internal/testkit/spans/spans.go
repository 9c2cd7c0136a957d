// Package spans records the OpenTelemetry spans a test makes, in memory,
// for the tests that check pgbaton's traces.
package spans

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Recorder is a TracerProvider whose finished spans the test can read.
type Recorder struct {
	*sdktrace.TracerProvider
	exp *tracetest.InMemoryExporter
}

// New is a Recorder shut down when t ends.
func New(t testing.TB) *Recorder {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &Recorder{TracerProvider: tp, exp: exp}
}

// Named are the finished spans called name, in the order they ended.
func (r *Recorder) Named(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range r.exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// All are the finished spans.
func (r *Recorder) All() []tracetest.SpanStub { return r.exp.GetSpans() }

// Attrs are a span's attributes by key.
func Attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value, len(s.Attributes))
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}
