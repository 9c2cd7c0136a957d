package fencedwrite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// Value is a fenced value: a small JSON document in pgbaton.fenced_value
// (a job checkpoint, a cursor) that outlives any one lease. Only a writer
// whose token is not older than the last writer's may change it, so a
// paused former holder cannot move a checkpoint back.
type Value struct {
	Key       string          // the key it is stored under in pgbaton.fenced_value
	Token     int64           // token of the last writer
	Data      json.RawMessage // the JSON document, as jsonb gives it back (not byte for byte what was put)
	UpdatedAt time.Time       // by the database clock
}

// retries bounds the loops that re-read a value to explain a refused
// write and find it changed again in between.
const retries = 8

// PutValue stores data under key if the stored token is not newer than
// token (put-if-token-not-older) and returns what was stored. Otherwise it
// writes nothing and returns a *StaleTokenError with the stored token as
// Current. q may be a pool, a connection or the transaction that holds
// the lease's Guard.
func PutValue(ctx context.Context, q Querier, key string, token int64, data json.RawMessage) (Value, error) {
	if err := checkValueArgs(q, key, token, data); err != nil {
		return Value{}, err
	}
	dbq := db.New()
	for range retries {
		row, err := dbq.FencedValuePut(ctx, q, db.FencedValuePutParams{Key: key, Token: token, Value: data})
		if err == nil {
			return value(row), nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return Value{}, valueError(ctx, q, "put", key, err)
		}
		cur, err := dbq.FencedValueGet(ctx, q, key)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // deleted in between: try again
		case err != nil:
			return Value{}, valueError(ctx, q, "put", key, err)
		}
		return Value{}, staleValue(key, token, cur.Token)
	}
	return Value{}, fmt.Errorf("fencedwrite: put fenced value %q: it kept changing; gave up after %d tries", key, retries)
}

// GetValue returns the value stored under key, or ErrNotFound.
func GetValue(ctx context.Context, q Querier, key string) (Value, error) {
	if err := checkKey(q, key); err != nil {
		return Value{}, err
	}
	row, err := db.New().FencedValueGet(ctx, q, key)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Value{}, fmt.Errorf("%w: %q", ErrNotFound, key)
	case err != nil:
		return Value{}, valueError(ctx, q, "get", key, err)
	}
	return value(row), nil
}

// CompareAndSwapValue stores data under key only if the stored value
// equals expected (jsonb equality: key order and spacing do not matter)
// and the stored token is not newer than token. A nil expected means the
// key must have no value yet. It returns what was stored; a *StaleTokenError
// when the stored token is newer; or an error wrapping ErrValueChanged (and
// ErrNotFound when the key has no value) when the value is not the
// expected one.
func CompareAndSwapValue(ctx context.Context, q Querier, key string, token int64, expected, data json.RawMessage) (Value, error) {
	if err := checkValueArgs(q, key, token, data); err != nil {
		return Value{}, err
	}
	if expected != nil && !json.Valid(expected) {
		return Value{}, fmt.Errorf("%w: expected is not valid JSON", pgbaton.ErrInvalidArgument)
	}
	dbq := db.New()
	for range retries {
		var row db.PgbatonFencedValue
		var err error
		if expected == nil {
			row, err = dbq.FencedValueCreate(ctx, q, db.FencedValueCreateParams{Key: key, Token: token, Value: data})
		} else {
			row, err = dbq.FencedValueSwap(ctx, q, db.FencedValueSwapParams{Key: key, Token: token, Value: data, Expected: expected})
		}
		if err == nil {
			return value(row), nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return Value{}, valueError(ctx, q, "compare-and-swap", key, err)
		}
		// Nothing written: say why. The stored token wins over the value.
		cur, err := dbq.FencedValueCompare(ctx, q, db.FencedValueCompareParams{Key: key, Expected: expected})
		switch {
		case errors.Is(err, pgx.ErrNoRows) && expected == nil:
			continue // deleted in between: try again
		case errors.Is(err, pgx.ErrNoRows):
			return Value{}, fmt.Errorf("%w: %q has no value (%w)", ErrValueChanged, key, ErrNotFound)
		case err != nil:
			return Value{}, valueError(ctx, q, "compare-and-swap", key, err)
		case cur.Token > token:
			return Value{}, staleValue(key, token, cur.Token)
		case expected == nil || !cur.Matches:
			return Value{}, fmt.Errorf("%w: %q is not the expected value", ErrValueChanged, key)
		}
		// It was changed and changed back in between: try again.
	}
	return Value{}, fmt.Errorf("fencedwrite: compare-and-swap fenced value %q: it kept changing; gave up after %d tries", key, retries)
}

// DeleteValue removes the value under key if the stored token is not newer
// than token. It returns ErrNotFound when there is no value and a
// *StaleTokenError when the stored token is newer.
func DeleteValue(ctx context.Context, q Querier, key string, token int64) error {
	if err := checkKey(q, key); err != nil {
		return err
	}
	if err := positive(token); err != nil {
		return err
	}
	dbq := db.New()
	n, err := dbq.FencedValueDelete(ctx, q, db.FencedValueDeleteParams{Key: key, Token: token})
	if err != nil {
		return valueError(ctx, q, "delete", key, err)
	}
	if n > 0 {
		return nil
	}
	cur, err := dbq.FencedValueGet(ctx, q, key)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: %q", ErrNotFound, key)
	case err != nil:
		return valueError(ctx, q, "delete", key, err)
	}
	return staleValue(key, token, cur.Token)
}

func checkValueArgs(q Querier, key string, token int64, data json.RawMessage) error {
	if err := checkKey(q, key); err != nil {
		return err
	}
	if !json.Valid(data) {
		return fmt.Errorf("%w: data is not valid JSON", pgbaton.ErrInvalidArgument)
	}
	return positive(token)
}

func checkKey(q Querier, key string) error {
	switch {
	case isNil(q):
		return fmt.Errorf("%w: nil pool, connection or transaction", pgbaton.ErrInvalidArgument)
	case key == "" || len(key) > maxName:
		return fmt.Errorf("%w: fenced value key must be 1 to %d bytes, got %d", pgbaton.ErrInvalidArgument, maxName, len(key))
	}
	return nil
}

func staleValue(key string, presented, current int64) error {
	return &StaleTokenError{Name: key, Presented: presented, Current: current, Reason: "older than the value's"}
}

func valueError(ctx context.Context, q Querier, op, key string, err error) error {
	return fmt.Errorf("fencedwrite: %s fenced value %q: %w", op, key, standbyError(ctx, q, notMigrated(MapError(err))))
}

func value(row db.PgbatonFencedValue) Value {
	return Value{Key: row.Key, Token: row.Token, Data: row.Value, UpdatedAt: row.UpdatedAt}
}
