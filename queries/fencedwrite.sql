-- name: FenceAssertToken :exec
-- fencedwrite.Guard: check (name, token) and lock the lease row FOR SHARE
-- until the transaction ends; raises PB001 when the token is stale.
SELECT pgbaton.assert_token(@name::text, @token::bigint);

-- name: FenceAssertTokenXid :one
-- fencedwrite.InTx: the guard plus the transaction's id, so that after a
-- COMMIT whose reply was lost InTx can ask txid_status whether it
-- committed. The row lock already gave the transaction an id, so
-- txid_current() costs nothing extra.
SELECT pgbaton.assert_token(@name::text, @token::bigint)::bool AS ok, txid_current()::bigint AS xid;

-- name: FenceTxStatus :one
-- 'committed', 'aborted', 'in progress', or 'unknown' when the id is too
-- old to know.
SELECT coalesce(txid_status(@xid::bigint), 'unknown')::text AS status;

-- name: FenceSetToken :exec
-- The token a DELETE presents to pgbaton.reject_stale_token, for the rest
-- of the transaction only.
SELECT set_config('pgbaton.fence_token', CAST(@token::bigint AS text), true);

-- name: FenceEnable :exec
SELECT pgbaton.enable_fencing(CAST(@relation::text AS regclass));

-- name: FenceDisable :exec
SELECT pgbaton.disable_fencing(CAST(@relation::text AS regclass));

-- name: FencedValuePut :one
-- Put-if-token-not-older: no row when the stored token is newer.
INSERT INTO pgbaton.fenced_value AS f (key, token, value, updated_at)
VALUES (@key::text, @token::bigint, @value::jsonb, clock_timestamp())
ON CONFLICT (key) DO UPDATE
   SET token = excluded.token, value = excluded.value, updated_at = excluded.updated_at
 WHERE f.token <= excluded.token
RETURNING f.key, f.token, f.value, f.updated_at;

-- name: FencedValueGet :one
SELECT key, token, value, updated_at FROM pgbaton.fenced_value WHERE key = @key::text;

-- name: FencedValueSwap :one
-- Compare-and-set: write only when the stored value equals expected (jsonb
-- equality) and the stored token is not newer; no row otherwise.
UPDATE pgbaton.fenced_value
   SET token = @token::bigint, value = @value::jsonb, updated_at = clock_timestamp()
 WHERE key = @key::text AND token <= @token::bigint AND value = @expected::jsonb
RETURNING key, token, value, updated_at;

-- name: FencedValueCreate :one
-- Compare-and-set against "absent": no row when the key exists.
INSERT INTO pgbaton.fenced_value (key, token, value, updated_at)
VALUES (@key::text, @token::bigint, @value::jsonb, clock_timestamp())
ON CONFLICT (key) DO NOTHING
RETURNING key, token, value, updated_at;

-- name: FencedValueDelete :execrows
DELETE FROM pgbaton.fenced_value WHERE key = @key::text AND token <= @token::bigint;

-- name: FencedValueCompare :one
-- Why a compare-and-set wrote nothing: the stored token, and whether the
-- stored value equals expected by jsonb equality.
SELECT token, coalesce(value = @expected::jsonb, false)::bool AS matches FROM pgbaton.fenced_value WHERE key = @key::text;
