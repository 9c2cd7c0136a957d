-- The test kit's faults (package pgbatontest): each makes in the database
-- what a real fault would leave there. Nothing in the library calls them.

-- name: TestkitExpire :one
-- Grant (name, token) expires now, as if its TTL ran out unrenewed.
UPDATE pgbaton.lease l
   SET expires_at = clock_timestamp() - interval '1 millisecond', session_id = NULL
 WHERE l.name = @name AND l.token = sqlc.arg(token)::bigint
   AND EXISTS (SELECT FROM pgbaton.lease_status s WHERE s.name = l.name AND s.held)
RETURNING l.lease_group;

-- name: TestkitTakeOver :one
-- Grant (name, token) is taken over by new_owner with a new token, held
-- for ttl_ms with no session, as if its holder had been paused past it.
UPDATE pgbaton.lease l
   SET owner = @new_owner::text, token = pgbaton.next_token(), acquired_at = clock_timestamp(),
       renewed_at = clock_timestamp(), expires_at = clock_timestamp() + sqlc.arg(ttl_ms)::bigint * interval '1 millisecond',
       session_id = NULL, grant_ref = NULL
 WHERE l.name = @name AND l.token = sqlc.arg(token)::bigint
   AND EXISTS (SELECT FROM pgbaton.lease_status s WHERE s.name = l.name AND s.held)
RETURNING l.token, l.lease_group;

-- name: TestkitNotify :exec
SELECT pgbaton.notify_waiters(@names::text[]);

-- name: TestkitLockToken :one
SELECT l.token FROM pgbaton.lease l WHERE l.name = @name FOR UPDATE;

-- name: TestkitForceRelease :one
SELECT f.old_token::bigint AS old_token, f.new_token::bigint AS new_token
  FROM pgbaton.force_release_lease(sqlc.arg(name)::text, sqlc.arg(reason)::text) f;

-- name: TestkitHolder :one
SELECT s.owner, s.token, s.expires_at, s.held FROM pgbaton.lease_status s WHERE s.name = @name;
