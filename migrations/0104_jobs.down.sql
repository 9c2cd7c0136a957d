DROP TABLE pgbaton.cron_slot;
DROP TABLE pgbaton.job_run;
