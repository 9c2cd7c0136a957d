-- name: FenceAssertToken :one
-- fencedwrite.Guard: check (name, token) and lock the lease row FOR SHARE
-- until the transaction ends; raises PB001 when the token is stale. On a
-- standby it checks nothing and says so (standby), before the row lock
-- would fail with a read-only error that does not tell a standby from a
-- read-only transaction (PostgreSQL 13 reports no in_hot_standby).
SELECT pg_is_in_recovery()::bool AS standby,
       (CASE WHEN pg_is_in_recovery() THEN false ELSE pgbaton.assert_token(@name::text, @token::bigint) END)::bool AS ok;

-- name: FenceAssertTokenXid :one
-- fencedwrite.InTx: the guard plus the transaction's id, so that after a
-- COMMIT whose reply was lost InTx can ask txid_status whether it
-- committed. The row lock already gave the transaction an id, so
-- txid_current() costs nothing extra. A standby gets no id: see standby.
-- timeline is the one the transaction runs on (0 where the server does
-- not tell, see pgbaton.insert_timeline): an id means that transaction only
-- on this timeline.
SELECT pg_is_in_recovery()::bool AS standby,
       (CASE WHEN pg_is_in_recovery() THEN false ELSE pgbaton.assert_token(@name::text, @token::bigint) END)::bool AS ok,
       (CASE WHEN pg_is_in_recovery() THEN 0 ELSE txid_current() END)::bigint AS xid,
       coalesce(CASE WHEN pg_is_in_recovery() THEN NULL ELSE pgbaton.insert_timeline() END, 0)::bigint AS timeline;

-- name: FenceTxStatus :one
-- 'committed', 'aborted', 'in progress', or 'unknown' when the id is too
-- old to know; with the timeline this server writes on (0 on a standby,
-- or where the server does not tell).
SELECT coalesce(txid_status(@xid::bigint), 'unknown')::text AS status,
       coalesce(CASE WHEN pg_is_in_recovery() THEN NULL ELSE pgbaton.insert_timeline() END, 0)::bigint AS timeline;

-- name: FenceSetToken :exec
-- The token writes to fenced tables present to pgbaton.reject_stale_token,
-- for the rest of the transaction only.
SELECT pgbaton.present_token(@token::bigint);

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

-- name: FenceInRecovery :one
-- Whether a write refused as read-only was refused because the server is
-- a standby, for servers too old to report in_hot_standby.
SELECT pg_is_in_recovery()::bool AS in_recovery;

-- name: FenceBypass :one
-- fencedwrite.BypassFencing: pgbaton_admin only; writes the audit row.
SELECT pgbaton.bypass_fencing(CAST(@relation::text AS regclass), @reason::text)::bigint AS event_id;

-- name: ProcessedMark :exec
-- fencedwrite.MarkProcessed: raises PB409, aborting the transaction, on a
-- repeat.
SELECT pgbaton.mark_processed(@consumer::text, @message_id::text);

-- name: ProcessedPrune :one
-- fencedwrite.PruneProcessed: one batch.
SELECT pgbaton.prune_processed(make_interval(secs => @older_than_seconds::float8), @batch::int)::int AS deleted;
