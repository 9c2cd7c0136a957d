package leasetable_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// A failed acquire carries error.type (OpenTelemetry's semantic
// conventions): here a context that ended before the database answered.
func TestMetricsErrorType(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	m := newMeter(t)
	c := newClient(t, pool, leasetable.Config{Owner: "a", TTL: time.Minute, MeterProvider: m})
	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err := c.TryAcquire(done, "e")
	require.ErrorIs(t, err, context.Canceled)
	require.EqualValues(t, 1, m.sum(t, "pgbaton.acquire.attempts", "error.type", "canceled"))
	require.EqualValues(t, 1, m.sum(t, "pgbaton.acquire.wait.duration", "error.type", "canceled"))
	require.EqualValues(t, 1, m.sum(t, "pgbaton.acquire.attempts", "pgbaton.result", "error"))
}
