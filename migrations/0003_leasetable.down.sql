DROP TABLE pgbaton.cron_slot;
DROP TABLE pgbaton.job_run;
DROP FUNCTION pgbaton.claim(text, text, integer, bigint);
DROP FUNCTION pgbaton.register(text, text[]);
DROP FUNCTION pgbaton.complete(text, text, bigint);
DROP FUNCTION pgbaton.release(text, text, bigint);
DROP FUNCTION pgbaton.stop_waiting(text, text);
DROP FUNCTION pgbaton.wait_for(text, text, boolean);
DROP TABLE pgbaton.lease_waiter;
DROP FUNCTION pgbaton.renew(text, text, bigint, bigint);
DROP FUNCTION pgbaton.try_acquire(text, text, bigint);
DROP FUNCTION pgbaton.lease_attempt(text, text, bigint, jsonb);
DROP FUNCTION pgbaton.lease_check_args(text, text, bigint);
-- Drops its indexes and the owned sequence lease_token_seq with it.
DROP TABLE pgbaton.lease;
