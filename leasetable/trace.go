package leasetable

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// Span names: one per public call that waits or touches the database, and
// the session's keep-alive.
const (
	spanAcquire   = "pgbaton.lease.acquire"  // Acquire, TryAcquire, Semaphore, TrySemaphore
	spanClaim     = "pgbaton.lease.claim"    // Claim, ClaimWait, CompleteAndClaim
	spanComplete  = "pgbaton.lease.complete" // Complete, CompleteTx
	spanKeepalive = "pgbaton.lease.keepalive"
)

// endGrant ends the span of a call on name (a lease, semaphore or group)
// that began at start and granted leases, or failed with err: its outcome
// comes from leasetable's errors (held for ErrHeld, a grace's too).
func (c *Client) endGrant(span trace.Span, key attribute.Key, name string, start time.Time, leases []*Lease, err error) {
	outcome, token := telemetry.Acquired, int64(0)
	switch {
	case errors.Is(err, ErrHeld):
		outcome = telemetry.Held
	case err != nil:
		outcome = telemetry.Error
	case len(leases) == 0:
		outcome = telemetry.None
	case len(leases) == 1:
		token = leases[0].token
	}
	telemetry.EndGrant(span, key, name, c.cfg.Owner, start, len(leases), token, outcome, err)
}

// waitCall is a waiting call that began at start: waitLoop for q, with
// the call's span (named span, q.name under key) and metrics.
func (c *Client) waitCall(ctx context.Context, span string, key attribute.Key, start time.Time, q want) ([]*Lease, error) {
	ctx, sp := c.tr.Start(ctx, span, "lease")
	got, stillHeld, err := c.waitLoop(ctx, q)
	if q.drain && errors.Is(err, ErrDrained) {
		// The end of the batch, not a failed claim: no error metric, and
		// the span's outcome is "none".
		c.endGrant(sp, key, q.name, start, nil, nil)
		return nil, err
	}
	c.waitEnded(ctx, q.name, start, stillHeld, err)
	c.endGrant(sp, key, q.name, start, got, err)
	return got, err
}

// once is a call that looks once (TryAcquire, Claim, TrySemaphore), with
// the call's span (named span, name under key) and metrics: look's error
// is a failed attempt (a *HeldError a held one), nothing granted a held
// one. start is when the call began.
func (c *Client) once(ctx context.Context, span string, key attribute.Key, name string, look func(ctx context.Context, start time.Time) ([]*Lease, error)) ([]*Lease, error) {
	start := time.Now()
	ctx, sp := c.tr.Start(ctx, span, "lease")
	got, err := look(ctx, start)
	switch {
	case err != nil:
		c.attemptFailed(ctx, name, err, start)
	case len(got) == 0:
		c.tel.AttemptSince(ctx, name, telemetry.Held, start)
	}
	c.endGrant(sp, key, name, start, got, err)
	return got, err
}

// first is the lease of a call that grants one, got, or its error.
func first(got []*Lease, err error) (*Lease, error) {
	if err != nil {
		return nil, err
	}
	return got[0], nil
}
