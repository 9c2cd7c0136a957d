-- Tables of the demo (examples/demo), in their own schema so the demo can
-- run against any database and leave nothing behind. Read by sqlc as
-- schema, embedded into the demo.
CREATE SCHEMA IF NOT EXISTS pgbaton_demo;

-- One row per run of the cron job: invariant, one per slot.
CREATE TABLE pgbaton_demo.slot_run (
    job    text        NOT NULL,
    slot   timestamptz NOT NULL,
    worker integer     NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per processed work item, written in the item lease's fenced
-- transaction: invariant, every item exactly once.
CREATE TABLE pgbaton_demo.processed (
    item        text        NOT NULL,
    worker      integer     NOT NULL,
    token       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per leadership term, written when the leader starts.
CREATE TABLE pgbaton_demo.leader_term (
    term        bigint      NOT NULL,
    worker      integer     NOT NULL,
    acquired_at timestamptz NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
