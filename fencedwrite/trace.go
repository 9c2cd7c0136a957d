package fencedwrite

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"

	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// traced runs a fenced transaction under a span "pgbaton.fencedwrite.tx"
// when the caller's context carries a recording span: InTx has no Config
// to take a TracerProvider from, so it traces inside the caller's trace
// and never outside one. The outcome is committed, stale (a
// StaleTokenError) or error.
func traced(ctx context.Context, name string, token int64, run func(context.Context) error) error {
	ctx, span := telemetry.FromContext(ctx).Start(ctx, "pgbaton.fencedwrite.tx", "fencedwrite")
	err := run(ctx)
	if span.IsRecording() {
		span.SetAttributes(attribute.String(telemetry.NameKey, name), attribute.Int64(telemetry.TokenKey, token))
		outcome := "committed"
		var stale *StaleTokenError
		switch {
		case errors.As(err, &stale):
			outcome = "stale"
		case err != nil:
			outcome = telemetry.Error
		}
		telemetry.End(span, outcome, err)
	}
	return err
}
