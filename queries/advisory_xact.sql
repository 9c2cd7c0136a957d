-- name: AdvisoryXactLock :one
-- A transaction-scoped lock in the caller's transaction, released at its
-- commit or rollback (so it works behind transaction pooling), in every
-- variant: wait or try, shared or exclusive, bigint key or int4 pair. ok
-- is false when a try finds the key held. The statement checks
-- pg_is_in_recovery() itself, so refusing a standby costs no round trip
-- of its own and takes no lock there.
SELECT pg_is_in_recovery() AS standby,
       (CASE
            WHEN pg_is_in_recovery() THEN false
            WHEN @wait::bool AND @shared::bool AND @pair::bool THEN pg_advisory_xact_lock_shared(@hi::int4, @lo::int4) IS NOT NULL
            WHEN @wait::bool AND @shared::bool THEN pg_advisory_xact_lock_shared(@key::int8) IS NOT NULL
            WHEN @wait::bool AND @pair::bool THEN pg_advisory_xact_lock(@hi::int4, @lo::int4) IS NOT NULL
            WHEN @wait::bool THEN pg_advisory_xact_lock(@key::int8) IS NOT NULL
            WHEN @shared::bool AND @pair::bool THEN pg_try_advisory_xact_lock_shared(@hi::int4, @lo::int4)
            WHEN @shared::bool THEN pg_try_advisory_xact_lock_shared(@key::int8)
            WHEN @pair::bool THEN pg_try_advisory_xact_lock(@hi::int4, @lo::int4)
            ELSE pg_try_advisory_xact_lock(@key::int8)
        END)::bool AS ok;

-- name: AdvisoryXactLockName :one
-- The first lock of a name the Locker has not seen recorded: also reads
-- the name recorded under the key, and locks only when it is this name or
-- none (a different one is a collision). recorded_name is '' when no name
-- is recorded (names are never empty); read_only says whether this
-- transaction could record one.
SELECT pg_is_in_recovery() AS standby,
       current_setting('transaction_read_only')::bool AS read_only,
       coalesce(n.name, '')::text AS recorded_name,
       coalesce(n.namespace, '')::text AS recorded_namespace,
       (CASE
            WHEN pg_is_in_recovery() THEN false
            WHEN n.key IS NOT NULL AND (n.name <> @name::text OR n.namespace <> @namespace::text) THEN false
            WHEN @wait::bool AND @shared::bool THEN pg_advisory_xact_lock_shared(@key::int8) IS NOT NULL
            WHEN @wait::bool THEN pg_advisory_xact_lock(@key::int8) IS NOT NULL
            WHEN @shared::bool THEN pg_try_advisory_xact_lock_shared(@key::int8)
            ELSE pg_try_advisory_xact_lock(@key::int8)
        END)::bool AS ok
  FROM (SELECT 1) AS one (x)
  LEFT JOIN pgbaton.advisory_name n ON n.key = @key::int8;

-- name: AdvisoryXactRecordName :many
-- Records a name in the caller's transaction, run only while holding the
-- name's lock exclusively: no other transaction can be recording the same
-- name, so the insert never waits for one. A conflict (recorded meanwhile)
-- does nothing and locks no row, so later lockers of the name never wait
-- for this transaction. No row back: somebody else recorded the key.
INSERT INTO pgbaton.advisory_name AS n (key, namespace, name)
VALUES (pgbaton.advisory_key(@name::text, @namespace::text), @namespace::text, @name::text)
ON CONFLICT (key) DO NOTHING
RETURNING n.key;
