-- Package jobs: job runs (pgbaton.job_run) under a job's lease, and cron
-- slots (pgbaton.cron_slot).

-- name: JobRunStart :one
-- Starts a run under the lease (job, token). Runs of the job still marked
-- started belong to holders that lost the lease (we hold it now): they end
-- as lost (the CTE runs whether or not it is referenced). No row when the
-- lease is no longer valid. The new run resumes from the newest checkpoint of an unfinished
-- run, unless a run succeeded after it.
WITH lost AS (
    UPDATE pgbaton.job_run r
       SET status = 'lost', finished_at = clock_timestamp()
     WHERE r.job = @job::text AND r.status = 'started' AND r.token < @token::bigint
    RETURNING r.id
), l AS (
    SELECT 1 FROM pgbaton.lease
     WHERE name = @job::text AND owner = @owner::text AND token = @token::bigint
       AND pgbaton.lease_expiry(expires_at, pgbaton.session_expiry(session_id)) > clock_timestamp()
       FOR SHARE
), prev AS (
    SELECT r.status, r.checkpoint FROM pgbaton.job_run r
     WHERE r.job = @job::text
     ORDER BY r.id DESC LIMIT 1
)
INSERT INTO pgbaton.job_run (job, owner, token, checkpoint)
SELECT @job::text, @owner::text, @token::bigint,
       (SELECT p.checkpoint FROM prev p WHERE p.status <> 'succeeded')
 WHERE EXISTS (SELECT 1 FROM l)
RETURNING id, checkpoint, started_at;

-- name: JobRunCheckpoint :one
-- Stores state only while (job, token) is still the valid lease. FOR SHARE
-- holds the lease row until commit, so no takeover can slip in between the
-- check and the write.
WITH l AS (
    SELECT 1 FROM pgbaton.lease
     WHERE name = @job::text AND owner = @owner::text AND token = @token::bigint
       AND pgbaton.lease_expiry(expires_at, pgbaton.session_expiry(session_id)) > clock_timestamp()
       FOR SHARE
)
UPDATE pgbaton.job_run r
   SET checkpoint = @checkpoint::jsonb, heartbeat_at = clock_timestamp()
  FROM l
 WHERE r.id = @id::bigint AND r.token = @token::bigint AND r.status = 'started'
RETURNING r.heartbeat_at;

-- name: JobRunHeartbeat :exec
UPDATE pgbaton.job_run SET heartbeat_at = clock_timestamp()
 WHERE id = @id::bigint AND status = 'started';

-- name: JobRunFinish :one
-- Ends a run. A status other than lost is written only while the lease is
-- still valid; lost is always written.
WITH l AS (
    SELECT 1 FROM pgbaton.lease
     WHERE name = @job::text AND owner = @owner::text AND token = @token::bigint
       AND pgbaton.lease_expiry(expires_at, pgbaton.session_expiry(session_id)) > clock_timestamp()
       FOR SHARE
)
UPDATE pgbaton.job_run r
   SET status = @status::text, error = sqlc.narg(error)::text, finished_at = clock_timestamp()
 WHERE r.id = @id::bigint AND r.status = 'started'
   AND (@status::text = 'lost' OR EXISTS (SELECT 1 FROM l))
RETURNING r.status;

-- name: JobRunList :many
SELECT * FROM pgbaton.job_run WHERE job = @job::text ORDER BY id DESC LIMIT @max::integer;

-- name: CronSlotClaim :one
-- True for exactly one caller per (job, scheduled_at).
WITH ins AS (
    INSERT INTO pgbaton.cron_slot (job, scheduled_at, owner)
    VALUES (@job::text, @scheduled_at::timestamptz, @owner::text)
    ON CONFLICT (job, scheduled_at) DO NOTHING
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM ins)::boolean AS claimed;
