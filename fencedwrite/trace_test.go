package fencedwrite_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/spans"
)

// InTx is a span inside the caller's trace, with the lease, the token and
// whether the write committed or was refused as stale; outside a trace it
// starts none.
func TestInTxIsTracedInsideTheCallersTrace(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	tp := spans.New(t)
	token := acquire(t, ctx, pool, "job:a", "me", time.Minute)
	noop := func(pgx.Tx) error { return nil }

	require.NoError(t, fencedwrite.InTx(ctx, pool, fencedwrite.Token("job:a", token), noop))
	assert.Empty(t, tp.All(), "no span outside a trace")

	traced, root := tp.Tracer("test").Start(ctx, "handler")
	require.NoError(t, fencedwrite.InTx(traced, pool, fencedwrite.Token("job:a", token), noop))
	_, err := pool.Exec(ctx, "SELECT pgbaton.force_release_lease('job:a', 'test')")
	require.NoError(t, err)
	var stale *fencedwrite.StaleTokenError
	require.ErrorAs(t, fencedwrite.InTx(traced, pool, fencedwrite.Token("job:a", token), noop), &stale)
	root.End()

	var outcomes []string
	for _, s := range tp.Named("pgbaton.fencedwrite.tx") {
		assert.Equal(t, root.SpanContext().SpanID(), s.Parent.SpanID())
		at := spans.Attrs(s)
		assert.Equal(t, "job:a", at["pgbaton.name"].AsString())
		assert.Equal(t, "postgresql", at["db.system.name"].AsString())
		outcomes = append(outcomes, at["pgbaton.outcome"].AsString())
	}
	assert.Equal(t, []string{"committed", "stale"}, outcomes)
}
