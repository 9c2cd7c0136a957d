-- Every statement of a session carries the session's token and does its
-- work only on the backend that holds it ("WHERE
-- current_setting('pgbaton.session_token', true) = @token", checked
-- before the select list runs). The token is a random value set on the
-- backend when the connection became the Locker's (AdvisorySessionReady).
-- No row means the statement ran on another backend (a transaction-pooling
-- proxy sent it elsewhere), or another session set up on this backend
-- since (a pooler lent it to someone else): nothing was locked or unlocked
-- there, on a backend that belongs to other clients.

-- name: AdvisoryOp :one
-- Every request a multiplexed session sends that is not one of the two
-- below: op 0 ping, 1 try exclusive, 2 try shared, 3 unlock exclusive,
-- 4 unlock shared, as in the operation table of package pgsession
-- (advisory/internal, checked by a test). Keys come in two spaces that
-- Postgres keeps apart: one bigint (key), or a pair of int4 (pair, hi,
-- lo). Sessions prepare these three statements by name and pipeline them.
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
 WHERE current_setting('pgbaton.session_token', true) = @token::text;

-- name: AdvisoryTryOne :one
-- The most common requests, exclusive on a bigint key, without
-- AdvisoryOp's branching.
SELECT pg_try_advisory_lock(@key::int8) AS ok WHERE current_setting('pgbaton.session_token', true) = @token::text;

-- name: AdvisoryUnlockOne :one
SELECT pg_advisory_unlock(@key::int8) AS ok WHERE current_setting('pgbaton.session_token', true) = @token::text;

-- name: AdvisorySessionProbe :one
-- The first statement on every connection a Locker takes, sent with the
-- simple protocol (no prepared statement, whatever a pooler does with
-- them) and before anything is changed on the backend. The client address
-- and port as the server sees them tell a direct connection (they are the
-- client socket's own) from one through a proxy; the advisory locks the
-- backend holds already tell a backend shared with other clients.
SELECT pg_backend_pid()::int4 AS pid,
       pg_is_in_recovery() AS in_recovery,
       version()::text AS version,
       coalesce(host(inet_client_addr()), '')::text AS client_addr,
       coalesce(inet_client_port(), -1)::int4 AS client_port,
       (SELECT count(*) FROM pg_catalog.pg_locks l
         WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory')::int4 AS advisory_locks;

-- name: AdvisoryFastPathFunctions :one
-- The OIDs of the functions a session on a direct connection calls by the
-- fast-path protocol, in the order asked (the regprocedures of
-- advisory/internal/pgsession's operation table). Sent with the session
-- statements' Parse, once the server is known to be PostgreSQL.
SELECT CAST(CAST(CAST(@functions::text[] AS pg_catalog.regprocedure[]) AS pg_catalog.oid[]) AS int8[]) AS function_oids;

-- name: AdvisoryBackendPID :one
SELECT pg_backend_pid()::int4 AS pid;

-- name: AdvisorySessionReady :exec
-- Run once on every connection that passed the probe, pipelined with the
-- session statements' Parse. The TCP settings make the server drop a
-- silently partitioned client only after that client has given up its
-- locks (see the package documentation; on a unix socket they are
-- ignored); application_name shows the holder in pg_stat_activity; the
-- token marks the backend as this session's (see above).
SELECT set_config('tcp_keepalives_idle', @keepalives_idle::text, false),
       set_config('tcp_keepalives_interval', @keepalives_interval::text, false),
       set_config('tcp_keepalives_count', @keepalives_count::text, false),
       set_config('tcp_user_timeout', @user_timeout::text, false),
       set_config('application_name', @application_name::text, false),
       set_config('pgbaton.session_token', @token::text, false);

-- name: AdvisoryLock :one
-- Blocks until granted; run on a connection of its own. waited says
-- whether the key was held when the statement began (a contended
-- acquire). No row: another backend (see above).
SELECT (CASE WHEN pg_try_advisory_lock(@key::int8) THEN false
             ELSE pg_advisory_lock(@key::int8)::text = '' END)::bool AS waited
 WHERE current_setting('pgbaton.session_token', true) = @token::text;

-- name: AdvisoryLockShared :one
SELECT (CASE WHEN pg_try_advisory_lock_shared(@key::int8) THEN false
             ELSE pg_advisory_lock_shared(@key::int8)::text = '' END)::bool AS waited
 WHERE current_setting('pgbaton.session_token', true) = @token::text;

-- name: AdvisoryLockPair :one
SELECT (CASE WHEN pg_try_advisory_lock(@hi::int4, @lo::int4) THEN false
             ELSE pg_advisory_lock(@hi::int4, @lo::int4)::text = '' END)::bool AS waited
 WHERE current_setting('pgbaton.session_token', true) = @token::text;

-- name: AdvisoryLockPairShared :one
SELECT (CASE WHEN pg_try_advisory_lock_shared(@hi::int4, @lo::int4) THEN false
             ELSE pg_advisory_lock_shared(@hi::int4, @lo::int4)::text = '' END)::bool AS waited
 WHERE current_setting('pgbaton.session_token', true) = @token::text;

-- name: AdvisoryUnlockAll :execrows
-- Releases everything a session or a given-up wait holds (Postgres may
-- grant a wait just as the client cancels). 0 rows: another backend.
SELECT pg_advisory_unlock_all() WHERE current_setting('pgbaton.session_token', true) = @token::text;

-- name: AdvisoryRegisterName :one
-- One upsert per process and name. The row that comes back is the one
-- stored: a different name means two names share this key. lock_timeout,
-- set for this statement only and before the insert runs, bounds the
-- wait for a transaction that is recording the same key (XactLock records
-- names in the caller's transaction).
INSERT INTO pgbaton.advisory_name AS n (key, namespace, name)
SELECT pgbaton.advisory_key(@name::text, @namespace::text), @namespace::text, @name::text
  FROM (SELECT set_config('lock_timeout', @lock_timeout::text, true)) AS timeout (ms)
ON CONFLICT (key) DO UPDATE SET last_seen = clock_timestamp()
RETURNING n.key, n.namespace, n.name;
