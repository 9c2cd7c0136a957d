package leasetable_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/internal/testkit/spans"
	"github.com/pgbaton/pgbaton/leasetable"
)

// With a TracerProvider, each call that waits or touches the database is
// a span under the caller's, with the name or group, owner, token, count,
// wait and outcome; each keep-alive of the session is a span of its own.
func TestCallsAreTraced(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pool := env.DB(t).Pool(t)
	tp := spans.New(t)
	a := newClient(t, pool, leasetable.Config{Owner: "a", TTL: 3 * time.Second, TracerProvider: tp})
	b := newClient(t, pool, leasetable.Config{Owner: "b", TTL: 3 * time.Second, TracerProvider: tp})
	traced, root := tp.Tracer("test").Start(ctx, "handler")

	l, err := a.Acquire(traced, "report")
	require.NoError(t, err)
	_, err = b.TryAcquire(traced, "report")
	require.ErrorIs(t, err, leasetable.ErrHeld)
	waited := make(chan error, 1)
	go func() {
		l2, err := b.Acquire(traced, "report")
		if err == nil {
			err = l2.Release(ctx)
		}
		waited <- err
	}()
	queued(t, ctx, pool, "report", 1)
	releasedAt := time.Now()
	require.NoError(t, l.Release(ctx))
	require.NoError(t, <-waited)

	_, err = a.Register(ctx, "mail", "m1", "m2", "m3")
	require.NoError(t, err)
	items, err := a.Claim(traced, "mail", 2)
	require.NoError(t, err)
	require.NoError(t, a.Complete(traced, items[0]))
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return a.CompleteTx(traced, tx, items[1]) }))
	root.End()

	acquires := tp.Named("pgbaton.lease.acquire")
	require.Len(t, acquires, 3)
	outcomes := map[string]int{}
	for _, s := range acquires {
		at := spans.Attrs(s)
		assert.Equal(t, root.SpanContext().SpanID(), s.Parent.SpanID())
		assert.Equal(t, "postgresql", at["db.system.name"].AsString())
		assert.Equal(t, "report", at["pgbaton.name"].AsString())
		outcomes[at["pgbaton.outcome"].AsString()]++
		if at["pgbaton.owner"].AsString() == "a" {
			assert.Equal(t, l.Token(), at["pgbaton.token"].AsInt64())
		}
	}
	assert.Equal(t, map[string]int{"acquired": 2, "held": 1}, outcomes)
	last := spans.Attrs(acquires[2]) // b's Acquire, which waited for the release
	assert.GreaterOrEqual(t, last["pgbaton.wait.seconds"].AsFloat64(), releasedAt.Sub(acquires[2].StartTime).Seconds())

	claims := tp.Named("pgbaton.lease.claim")
	require.Len(t, claims, 1)
	assert.Equal(t, "mail", spans.Attrs(claims[0])["pgbaton.group"].AsString())
	assert.EqualValues(t, 2, spans.Attrs(claims[0])["pgbaton.count"].AsInt64())
	assert.Len(t, tp.Named("pgbaton.lease.complete"), 2, "Complete and CompleteTx")

	// The session's keep-alive, every RenewInterval (1s here).
	pgtest.Eventually(t, 20*time.Second, func() (bool, error) {
		return len(tp.Named("pgbaton.lease.keepalive")) > 0, nil
	}, "a keep-alive span")
	ka := spans.Attrs(tp.Named("pgbaton.lease.keepalive")[0])
	assert.Equal(t, "alive", ka["pgbaton.outcome"].AsString())
}
