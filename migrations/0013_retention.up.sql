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
CREATE INDEX job_run_finished_idx ON pgbaton.job_run (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX event_at_idx ON pgbaton.event (at);
CREATE INDEX lease_waiter_since_idx ON pgbaton.lease_waiter (since);
CREATE INDEX fenced_value_updated_idx ON pgbaton.fenced_value (updated_at);
CREATE INDEX advisory_name_last_seen_idx ON pgbaton.advisory_name (last_seen);
-- Named leases by their last grant, for their retention. acquired_at
-- changes only with a grant, which changes owner (indexed) anyway, so
-- renewals stay HOT.
CREATE INDEX lease_named_idx ON pgbaton.lease (acquired_at) WHERE lease_group IS NULL;

-- Renewals of leases renewed one by one (pgbaton.renew) touch no indexed
-- column; leave room on each page so they are HOT updates.
ALTER TABLE pgbaton.lease SET (fillfactor = 90);

-- prune deletes up to p_batch rows of p_table older than p_older_than by
-- its rule (above) and returns how many it deleted.
CREATE FUNCTION pgbaton.prune(p_table text, p_older_than interval, p_batch integer)
RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    cutoff timestamptz;
    n      integer;
BEGIN
    IF p_older_than IS NULL OR p_older_than <= interval '0' THEN
        RAISE EXCEPTION 'pgbaton: retention must be positive, got %', p_older_than USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
        RAISE EXCEPTION 'pgbaton: batch must be 1 to 100000, got %', p_batch USING ERRCODE = 'invalid_parameter_value';
    END IF;
    cutoff := clock_timestamp() - p_older_than;
    CASE p_table
    WHEN 'cron_slot' THEN
        DELETE FROM pgbaton.cron_slot c USING (
            SELECT s.job, s.scheduled_at FROM pgbaton.cron_slot s
             WHERE s.scheduled_at < cutoff ORDER BY s.scheduled_at LIMIT p_batch FOR UPDATE SKIP LOCKED) o
         WHERE c.job = o.job AND c.scheduled_at = o.scheduled_at;
    WHEN 'job_run' THEN
        DELETE FROM pgbaton.job_run r USING (
            SELECT j.id FROM pgbaton.job_run j
             WHERE j.finished_at < cutoff
               AND EXISTS (SELECT 1 FROM pgbaton.job_run k WHERE k.job = j.job AND k.id > j.id)
             ORDER BY j.finished_at LIMIT p_batch FOR UPDATE SKIP LOCKED) o
         WHERE r.id = o.id;
    WHEN 'event' THEN
        DELETE FROM pgbaton.event e USING (
            SELECT v.id FROM pgbaton.event v
             WHERE v.at < cutoff ORDER BY v.at LIMIT p_batch FOR UPDATE SKIP LOCKED) o
         WHERE e.id = o.id;
    WHEN 'lease_waiter' THEN
        DELETE FROM pgbaton.lease_waiter w USING (
            SELECT x.name, x.waiter FROM pgbaton.lease_waiter x
             WHERE x.since < cutoff ORDER BY x.since LIMIT p_batch FOR UPDATE SKIP LOCKED) o
         WHERE w.name = o.name AND w.waiter = o.waiter;
    WHEN 'fenced_value' THEN
        DELETE FROM pgbaton.fenced_value f USING (
            SELECT v.key FROM pgbaton.fenced_value v
             WHERE v.updated_at < cutoff ORDER BY v.updated_at LIMIT p_batch FOR UPDATE SKIP LOCKED) o
         WHERE f.key = o.key;
    WHEN 'advisory_name' THEN
        DELETE FROM pgbaton.advisory_name a USING (
            SELECT x.key FROM pgbaton.advisory_name x
             WHERE x.last_seen < cutoff ORDER BY x.last_seen LIMIT p_batch FOR UPDATE SKIP LOCKED) o
         WHERE a.key = o.key;
    WHEN 'processed_message' THEN
        RETURN pgbaton.prune_processed(p_older_than, p_batch);
    WHEN 'lease' THEN
        -- Never granted since the cutoff, and not held now (released, or
        -- its grant and session long expired).
        DELETE FROM pgbaton.lease l USING (
            SELECT x.name FROM pgbaton.lease x
             WHERE x.lease_group IS NULL AND coalesce(x.acquired_at, '-infinity') < cutoff
               AND (x.owner IS NULL OR pgbaton.lease_expiry(x.expires_at, x.session_id) < cutoff)
             ORDER BY x.acquired_at LIMIT p_batch FOR UPDATE SKIP LOCKED) o
         WHERE l.name = o.name;
    WHEN 'lease_session' THEN
        RETURN pgbaton.prune_sessions(p_older_than, p_batch);
    ELSE
        RAISE EXCEPTION 'pgbaton: no retention rule for table %', p_table USING ERRCODE = 'invalid_parameter_value';
    END CASE;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

COMMENT ON FUNCTION pgbaton.prune(text, interval, integer) IS
    'pgbaton: delete up to p_batch rows of p_table older than p_older_than by its retention rule; returns the count';
