-- Every statement of a session carries the backend pid the session was
-- set up on and does its work only there ("WHERE pg_backend_pid() = @pid",
-- checked before the select list runs): no row means a transaction-pooling
-- proxy (PgBouncer) sent the statement to another backend, and nothing was
-- locked or unlocked on that backend, which belongs to other clients.

-- name: AdvisoryOp :one
-- Every request a multiplexed session sends that is not one of the two
-- below: op 0 ping, 1 try exclusive, 2 try shared, 3 unlock exclusive,
-- 4 unlock shared. Keys come in two spaces that Postgres keeps apart: one
-- bigint (key), or a pair of int4 (pair, hi, lo). Sessions prepare these
-- three statements by name and pipeline them (advisory/wire.go).
SELECT (CASE
            WHEN @op::int = 0 THEN true
            WHEN @op::int = 1 AND @pair::bool THEN pg_try_advisory_lock(@hi::int4, @lo::int4)
            WHEN @op::int = 1 THEN pg_try_advisory_lock(@key::int8)
            WHEN @op::int = 2 AND @pair::bool THEN pg_try_advisory_lock_shared(@hi::int4, @lo::int4)
            WHEN @op::int = 2 THEN pg_try_advisory_lock_shared(@key::int8)
            WHEN @op::int = 3 AND @pair::bool THEN pg_advisory_unlock(@hi::int4, @lo::int4)
            WHEN @op::int = 3 THEN pg_advisory_unlock(@key::int8)
            WHEN @op::int = 4 AND @pair::bool THEN pg_advisory_unlock_shared(@hi::int4, @lo::int4)
            WHEN @op::int = 4 THEN pg_advisory_unlock_shared(@key::int8)
        END)::bool AS ok
 WHERE pg_backend_pid() = @pid::int4;

-- name: AdvisoryTryOne :one
-- The most common requests, exclusive on a bigint key, without
-- AdvisoryOp's branching.
SELECT pg_try_advisory_lock(@key::int8) AS ok WHERE pg_backend_pid() = @pid::int4;

-- name: AdvisoryUnlockOne :one
SELECT pg_advisory_unlock(@key::int8) AS ok WHERE pg_backend_pid() = @pid::int4;

-- name: AdvisorySessionSetup :one
-- Run once on every session connection. The TCP settings make the server
-- drop a silently partitioned client only after that client has given up
-- its locks (see the package documentation); on a unix socket they are
-- ignored.
SELECT pg_backend_pid()::int4 AS pid,
       pg_is_in_recovery() AS in_recovery,
       set_config('tcp_keepalives_idle', @keepalives_idle::text, false)::text AS keepalives_idle,
       set_config('tcp_keepalives_interval', @keepalives_interval::text, false)::text AS keepalives_interval,
       set_config('tcp_keepalives_count', @keepalives_count::text, false)::text AS keepalives_count,
       set_config('tcp_user_timeout', @user_timeout::text, false)::text AS user_timeout;

-- name: AdvisoryBackendPID :one
SELECT pg_backend_pid()::int4 AS pid;

-- name: AdvisoryLock :execrows
-- Blocks until granted; run on a connection of its own. 0 rows: another
-- backend (see above).
SELECT pg_advisory_lock(@key::int8) WHERE pg_backend_pid() = @pid::int4;

-- name: AdvisoryLockShared :execrows
SELECT pg_advisory_lock_shared(@key::int8) WHERE pg_backend_pid() = @pid::int4;

-- name: AdvisoryLockPair :execrows
SELECT pg_advisory_lock(@hi::int4, @lo::int4) WHERE pg_backend_pid() = @pid::int4;

-- name: AdvisoryLockPairShared :execrows
SELECT pg_advisory_lock_shared(@hi::int4, @lo::int4) WHERE pg_backend_pid() = @pid::int4;

-- name: AdvisoryUnlockAll :execrows
-- Releases everything a session or a given-up wait holds (Postgres may
-- grant a wait just as the client cancels). 0 rows: another backend.
SELECT pg_advisory_unlock_all() WHERE pg_backend_pid() = @pid::int4;

-- name: AdvisoryXactTry :one
-- Transaction-scoped: released at commit or rollback, so it works behind
-- transaction pooling.
SELECT (CASE
            WHEN @shared::bool AND @pair::bool THEN pg_try_advisory_xact_lock_shared(@hi::int4, @lo::int4)
            WHEN @shared::bool THEN pg_try_advisory_xact_lock_shared(@key::int8)
            WHEN @pair::bool THEN pg_try_advisory_xact_lock(@hi::int4, @lo::int4)
            ELSE pg_try_advisory_xact_lock(@key::int8)
        END)::bool AS ok;

-- name: AdvisoryXactLock :exec
SELECT pg_advisory_xact_lock(@key::int8);

-- name: AdvisoryXactLockShared :exec
SELECT pg_advisory_xact_lock_shared(@key::int8);

-- name: AdvisoryXactLockPair :exec
SELECT pg_advisory_xact_lock(@hi::int4, @lo::int4);

-- name: AdvisoryXactLockPairShared :exec
SELECT pg_advisory_xact_lock_shared(@hi::int4, @lo::int4);

-- name: AdvisoryRegisterName :one
-- One upsert per process and name. The row that comes back is the one
-- stored: a different name means two names share this key.
INSERT INTO pgbaton.advisory_name AS n (key, namespace, name)
VALUES (pgbaton.advisory_key(@name::text, @namespace::text), @namespace::text, @name::text)
ON CONFLICT (key) DO UPDATE SET last_seen = clock_timestamp()
RETURNING n.key, n.namespace, n.name;
