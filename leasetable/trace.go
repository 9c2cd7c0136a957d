package leasetable

import (
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// Span names: one per public call that waits or touches the database, and
// the session's keep-alive.
const (
	spanAcquire    = "pgbaton.lease.acquire"  // Acquire, TryAcquire, Semaphore, TrySemaphore
	spanClaim      = "pgbaton.lease.claim"    // Claim, ClaimWait, CompleteAndClaim
	spanComplete   = "pgbaton.lease.complete" // Complete, CompleteTx
	spanKeepalive  = "pgbaton.lease.keepalive"
	outcomeNone    = "none"    // a claim that found nothing free
	outcomeDone    = "done"    // completed
	outcomeAlive   = "alive"   // a keep-alive that kept the session
	outcomeExpired = "expired" // a keep-alive that found the session gone
)

// endGrant ends the span of a call on name (a lease, semaphore or group)
// that began at start and granted leases, or failed with err.
func (c *Client) endGrant(span trace.Span, key attribute.Key, name string, start time.Time, leases []*Lease, err error) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String(string(key), name), attribute.String(telemetry.OwnerKey, c.cfg.Owner),
		telemetry.Waited(time.Since(start)), attribute.Int(telemetry.CountKey, len(leases)))
	outcome := telemetry.Acquired
	switch {
	case errors.Is(err, ErrHeld):
		outcome = telemetry.Held
	case err != nil:
		outcome = telemetry.Error
	case len(leases) == 0:
		outcome = outcomeNone
	case len(leases) == 1:
		span.SetAttributes(attribute.Int64(telemetry.TokenKey, leases[0].token))
	}
	telemetry.End(span, outcome, err)
}

// endComplete ends the span of a completion of n leases.
func (c *Client) endComplete(span trace.Span, n int, err error) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String(telemetry.OwnerKey, c.cfg.Owner), attribute.Int(telemetry.CountKey, n))
	telemetry.End(span, outcomeDone, err)
}

// one is l as the leases of a call that returns one lease.
func one(l *Lease) []*Lease {
	if l == nil {
		return nil
	}
	return []*Lease{l}
}

// endKeepalive ends the span of a keep-alive of session id carrying n
// leases.
func (c *Client) endKeepalive(span trace.Span, id int64, n int, alive bool, err error) {
	span.SetAttributes(attribute.String(telemetry.OwnerKey, c.cfg.Owner), attribute.Int64("pgbaton.session", id),
		attribute.Int(telemetry.CountKey, n))
	outcome := outcomeAlive
	switch {
	case err != nil:
		outcome = telemetry.Error
	case !alive:
		outcome = outcomeExpired
	}
	telemetry.End(span, outcome, err)
}
