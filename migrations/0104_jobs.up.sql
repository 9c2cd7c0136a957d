-- Job runs: one row per run of a job under its lease, so a later holder can
-- see what happened and resume from the last checkpoint.
CREATE TABLE pgbaton.job_run (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job          text NOT NULL CHECK (job <> '' AND octet_length(job) <= 255),
    owner        text NOT NULL,
    -- The lease token the run was started under; checkpoints are fenced by it.
    token        bigint NOT NULL,
    status       text NOT NULL DEFAULT 'started'
                 CHECK (status IN ('started', 'succeeded', 'failed', 'cancelled', 'lost')),
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at  timestamptz,
    heartbeat_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    error        text,
    checkpoint   jsonb,
    CHECK ((status = 'started') = (finished_at IS NULL))
);

CREATE INDEX job_run_job_idx ON pgbaton.job_run (job, id DESC);

CREATE INDEX job_run_finished_idx ON pgbaton.job_run (finished_at) WHERE finished_at IS NOT NULL;

-- Cron slots: a scheduled run of a job is claimed once per (job,
-- scheduled_at), whichever node's ticker fires first.
CREATE TABLE pgbaton.cron_slot (
    job          text NOT NULL CHECK (job <> '' AND octet_length(job) <= 255),
    scheduled_at timestamptz NOT NULL,
    owner        text NOT NULL,
    claimed_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job, scheduled_at)
);

-- Retention: every table that grows with use has a rule that bounds it,
-- applied in small batches (pgbaton.prune, one table per call) by one
-- client at a time (leasetable's background pruner holds the lease
-- "pgbaton:retention" while it prunes). Each rule deletes the oldest rows
-- first, up to p_batch, skipping rows somebody else has locked, so a call
-- is short and never waits.
--
--   table              rule (default retention in leasetable.Retention)
--   cron_slot          slots scheduled longer ago than the retention (7 days)
--   job_run            finished runs older than the retention (30 days),
--                      except the newest run of each job
--   event              audit rows older than the retention (365 days)
--   lease_waiter       registrations older than the retention (1 day): a
--                      waiter that crashed never removed its own
--   fenced_value       values not written for the retention (90 days)
--   advisory_name      names not registered for the retention (90 days)
--   processed_message  as pgbaton.prune_processed (7 days)
--   lease              leases without a group (named, not work items)
--                      neither held nor granted for the retention (7 days);
--                      a later grant makes a new row with a larger token
--   lease_session      sessions dead for the retention (1 minute)
--
-- Work items are deleted when completed; registered items, shards and
-- semaphore slots (leases with a group) are never pruned.
CREATE INDEX cron_slot_scheduled_idx ON pgbaton.cron_slot (scheduled_at);
