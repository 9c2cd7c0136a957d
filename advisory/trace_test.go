package advisory_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/internal/testkit/spans"
)

// With a TracerProvider, each lock call is a span under the caller's,
// with what an operator filters on: the name, the owner, the mode, the
// wait and what came of it.
func TestLockCallsAreTraced(t *testing.T) {
	ctx := pgtest.Context(t, 30*time.Second)
	d := env.DB(t)
	pool := d.Pool(t)
	tp := spans.New(t)
	a := newLocker(t, pool, advisory.Config{Owner: "a", TracerProvider: tp})
	b := newLocker(t, pool, advisory.Config{Owner: "b", TracerProvider: tp})

	parent, root := tp.Tracer("test").Start(ctx, "handler")
	lk, err := a.TryLock(parent, advisory.Name("report"))
	require.NoError(t, err)
	_, err = b.TryLock(parent, advisory.Name("report"))
	require.ErrorIs(t, err, advisory.ErrLocked)
	got := make(chan error, 1)
	go func() {
		lk2, err := b.Lock(parent, advisory.Name("report"))
		if err == nil {
			err = lk2.Unlock(ctx)
		}
		got <- err
	}()
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		_, waiting := advisoryLocks(t, env.AdminPool(), d)
		return waiting > 0, nil
	}, "b's Lock waits on the server")
	unlockAt := time.Now()
	require.NoError(t, lk.Unlock(ctx))
	require.NoError(t, <-got)
	root.End()

	locks := tp.Named("pgbaton.advisory.lock")
	require.Len(t, locks, 3)
	for _, s := range locks {
		assert.Equal(t, root.SpanContext().SpanID(), s.Parent.SpanID(), "under the caller's span")
		at := spans.Attrs(s)
		assert.Equal(t, "postgresql", at["db.system.name"].AsString())
		assert.Equal(t, "advisory", at["pgbaton.layer"].AsString())
		assert.Equal(t, "report", at["pgbaton.name"].AsString())
	}
	first, refused, waited := spans.Attrs(locks[0]), spans.Attrs(locks[1]), spans.Attrs(locks[2])
	assert.Equal(t, "acquired", first["pgbaton.outcome"].AsString())
	assert.Equal(t, "a", first["pgbaton.owner"].AsString())
	assert.Equal(t, "held", refused["pgbaton.outcome"].AsString())
	assert.Equal(t, codes.Error, locks[1].Status.Code)
	assert.Equal(t, "acquired", waited["pgbaton.outcome"].AsString())
	assert.True(t, waited["pgbaton.wait"].AsBool())
	assert.GreaterOrEqual(t, waited["pgbaton.wait.seconds"].AsFloat64(), unlockAt.Sub(locks[2].StartTime).Seconds(),
		"the Lock that waited for the holder counts the wait until the unlock")
}
