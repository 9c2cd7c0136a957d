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

-- Slots by scheduled time, for their retention (pgbaton.prune).
CREATE INDEX cron_slot_scheduled_idx ON pgbaton.cron_slot (scheduled_at);

UPDATE pgbaton.schema_version SET version = 104;
