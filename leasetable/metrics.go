package leasetable

import (
	"context"
	"errors"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// Causes of a lost lease, the pgbaton.cause attribute of pgbaton.lost.
const (
	// CauseExpired: the local deadline passed while no renewal was failing
	// or in flight, or the process noticed it later than by the safety
	// margin: the process or its timers were paused (a GC or VM pause,
	// SIGSTOP, an overloaded machine).
	CauseExpired = "expired"
	// CauseRenew: renewals failed or hung (database or network down) until
	// the local deadline passed.
	CauseRenew = "renew"
	// CauseSuperseded: the database no longer had the grant when it was
	// renewed or released: taken over after an expiry, or released by an
	// operator.
	CauseSuperseded = "superseded"
	// CauseClockStep: the database's wall clock stepped forward by more
	// than the safety margin, so the database may have let the lease go
	// before its local deadline (ErrClockStep).
	CauseClockStep = "clock_step"
)

// metricName is the name a lease's metrics carry: its group if any (one
// series per group, not per item), else its own name.
func (l *Lease) metricName() string {
	if l.group != "" {
		return l.group
	}
	return l.name
}

// attemptFailed records an acquire that did not get the lease (grace,
// held or error); bad input and closed clients are not attempts.
func (c *Client) attemptFailed(ctx context.Context, name string, err error, start time.Time) {
	var held *HeldError
	switch {
	case errors.As(err, &held) && held.Grace:
		c.tel.AttemptSince(ctx, name, telemetry.Grace, start)
	case errors.Is(err, ErrHeld):
		c.tel.AttemptSince(ctx, name, telemetry.Held, start)
	case errors.Is(err, pgbaton.ErrInvalidArgument), errors.Is(err, pgbaton.ErrClosed):
	default:
		c.tel.AttemptFailedSince(ctx, name, err, start)
	}
}

// recordReleased records, once, the end of a lease given back; taken over
// counts as superseded. Without a MeterProvider it returns at once: the
// Recorded flag is the metrics' own.
func (l *Lease) recordReleased(takenOver bool) {
	if l.c.tel == nil || !l.st.Record() {
		return
	}
	cause := ""
	if takenOver {
		cause = CauseSuperseded
	}
	l.c.tel.Ended(context.Background(), l.metricName(), time.Since(l.grantedAt), cause)
}

// waitEnded records the end of a waiting acquire: held when it ended while
// somebody else held the lease (contention), else as attemptFailed.
func (c *Client) waitEnded(ctx context.Context, name string, start time.Time, stillHeld bool, err error) {
	switch {
	case stillHeld:
		c.tel.AttemptSince(ctx, name, telemetry.Held, start)
	case err != nil:
		c.attemptFailed(ctx, name, err, start)
	}
}
