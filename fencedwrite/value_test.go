package fencedwrite_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/fencedwrite"
)

func TestPutValueIfTokenNotOlder(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)

	_, err := fencedwrite.GetValue(ctx, pool, "cursor")
	require.ErrorIs(t, err, fencedwrite.ErrNotFound)

	v, err := fencedwrite.PutValue(ctx, pool, "cursor", 5, json.RawMessage(`{"offset": 10}`))
	require.NoError(t, err)
	require.Equal(t, int64(5), v.Token)
	require.JSONEq(t, `{"offset": 10}`, string(v.Data))
	require.False(t, v.UpdatedAt.IsZero())

	_, err = fencedwrite.PutValue(ctx, pool, "cursor", 5, json.RawMessage(`{"offset": 20}`))
	require.NoError(t, err, "the same token writes again")
	_, err = fencedwrite.PutValue(ctx, pool, "cursor", 4, json.RawMessage(`{"offset": 0}`))
	requireStale(t, err, "cursor", 4, 5, "older than the value's")
	v, err = fencedwrite.PutValue(ctx, pool, "cursor", 9, json.RawMessage(`{"offset": 30}`))
	require.NoError(t, err)
	require.Equal(t, int64(9), v.Token)

	got, err := fencedwrite.GetValue(ctx, pool, "cursor")
	require.NoError(t, err)
	require.Equal(t, int64(9), got.Token)
	require.JSONEq(t, `{"offset": 30}`, string(got.Data))
}

func TestCompareAndSwapValue(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)

	// Expecting absence creates.
	_, err := fencedwrite.CompareAndSwapValue(ctx, pool, "ckpt", 3, nil, json.RawMessage(`{"a": 1, "b": 2}`))
	require.NoError(t, err)
	_, err = fencedwrite.CompareAndSwapValue(ctx, pool, "ckpt", 3, nil, json.RawMessage(`1`))
	require.ErrorIs(t, err, fencedwrite.ErrValueChanged, "it exists now")
	_, err = fencedwrite.CompareAndSwapValue(ctx, pool, "ckpt", 2, nil, json.RawMessage(`1`))
	requireStale(t, err, "ckpt", 2, 3, "older than the value's")

	// jsonb equality: key order and spacing do not matter.
	v, err := fencedwrite.CompareAndSwapValue(ctx, pool, "ckpt", 4, json.RawMessage(`{"b":2,"a":1}`), json.RawMessage(`{"a": 5}`))
	require.NoError(t, err)
	require.Equal(t, int64(4), v.Token)

	_, err = fencedwrite.CompareAndSwapValue(ctx, pool, "ckpt", 4, json.RawMessage(`{"a": 1}`), json.RawMessage(`{"a": 6}`))
	require.ErrorIs(t, err, fencedwrite.ErrValueChanged)
	require.NotErrorIs(t, err, fencedwrite.ErrStaleToken)
	// Stale wins over a changed value: the caller must stop, not re-read.
	_, err = fencedwrite.CompareAndSwapValue(ctx, pool, "ckpt", 3, json.RawMessage(`{"a": 1}`), json.RawMessage(`{"a": 6}`))
	requireStale(t, err, "ckpt", 3, 4, "older than the value's")

	_, err = fencedwrite.CompareAndSwapValue(ctx, pool, "none", 4, json.RawMessage(`{}`), json.RawMessage(`{}`))
	require.ErrorIs(t, err, fencedwrite.ErrValueChanged)
	require.ErrorIs(t, err, fencedwrite.ErrNotFound)

	got, err := fencedwrite.GetValue(ctx, pool, "ckpt")
	require.NoError(t, err)
	require.JSONEq(t, `{"a": 5}`, string(got.Data))
}

func TestDeleteValue(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	_, err := fencedwrite.PutValue(ctx, pool, "k", 5, json.RawMessage(`true`))
	require.NoError(t, err)
	requireStale(t, fencedwrite.DeleteValue(ctx, pool, "k", 4), "k", 4, 5, "older than the value's")
	require.NoError(t, fencedwrite.DeleteValue(ctx, pool, "k", 6))
	require.ErrorIs(t, fencedwrite.DeleteValue(ctx, pool, "k", 6), fencedwrite.ErrNotFound)
	_, err = fencedwrite.GetValue(ctx, pool, "k")
	require.ErrorIs(t, err, fencedwrite.ErrNotFound)
}

// A checkpoint written in the same transaction as a Guard: both the lease
// and the value's token are checked, atomically with the other writes.
func TestValueInsideGuardedTransaction(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	token := acquire(t, ctx, pool, "job:export", "me", time.Minute)
	lease := fencedwrite.Token("job:export", token)
	require.NoError(t, fencedwrite.InTx(ctx, pool, lease, func(tx pgx.Tx) error {
		_, err := fencedwrite.PutValue(ctx, tx, "job:export/checkpoint", token, json.RawMessage(`{"last_id": 42}`))
		return err
	}))
	got, err := fencedwrite.GetValue(ctx, pool, "job:export/checkpoint")
	require.NoError(t, err)
	require.JSONEq(t, `{"last_id": 42}`, string(got.Data))
}

func TestValueBadInput(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	ok := json.RawMessage(`{}`)
	long := strings.Repeat("k", 256)
	checks := []error{
		func() error { _, err := fencedwrite.PutValue(ctx, nil, "k", 1, ok); return err }(),
		func() error { _, err := fencedwrite.PutValue(ctx, pool, "", 1, ok); return err }(),
		func() error { _, err := fencedwrite.PutValue(ctx, pool, long, 1, ok); return err }(),
		func() error { _, err := fencedwrite.PutValue(ctx, pool, "k", 0, ok); return err }(),
		func() error { _, err := fencedwrite.PutValue(ctx, pool, "k", 1, nil); return err }(),
		func() error { _, err := fencedwrite.PutValue(ctx, pool, "k", 1, json.RawMessage(`{`)); return err }(),
		func() error { _, err := fencedwrite.GetValue(ctx, pool, ""); return err }(),
		func() error { _, err := fencedwrite.GetValue(ctx, nil, "k"); return err }(),
		func() error {
			_, err := fencedwrite.CompareAndSwapValue(ctx, pool, "k", 1, json.RawMessage(`nope`), ok)
			return err
		}(),
		func() error { _, err := fencedwrite.CompareAndSwapValue(ctx, pool, "k", -1, nil, ok); return err }(),
		fencedwrite.DeleteValue(ctx, pool, "k", 0),
		fencedwrite.DeleteValue(ctx, pool, "", 1),
	}
	for i, err := range checks {
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "check %d", i)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.fenced_value").Scan(&n))
	require.Zero(t, n, "bad input stored nothing")
}
