DROP FUNCTION pgbaton.prune(text, interval, integer);
ALTER TABLE pgbaton.lease RESET (fillfactor);
DROP INDEX pgbaton.lease_named_idx;
DROP INDEX pgbaton.advisory_name_last_seen_idx;
DROP INDEX pgbaton.fenced_value_updated_idx;
DROP INDEX pgbaton.lease_waiter_since_idx;
DROP INDEX pgbaton.event_at_idx;
DROP INDEX pgbaton.job_run_finished_idx;
DROP INDEX pgbaton.cron_slot_scheduled_idx;
