package advisory

import (
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// traceLock ends the span of a lock call that began at start: the key, the
// mode, whether it waited and for how long, and what came of it. Called
// only for a recording span.
func traceLock(span trace.Span, owner string, key Key, shared, wait bool, start time.Time, contended bool, err error) {
	mode := "exclusive"
	if shared {
		mode = "shared"
	}
	span.SetAttributes(
		attribute.String(telemetry.NameKey, keyName(key)),
		attribute.String(telemetry.OwnerKey, owner),
		attribute.String("pgbaton.mode", mode),
		attribute.Bool("pgbaton.wait", wait),
		telemetry.Waited(time.Since(start)),
	)
	outcome := result(err, contended)
	if outcome == "" {
		outcome = telemetry.Error
	}
	telemetry.End(span, outcome, err)
}
