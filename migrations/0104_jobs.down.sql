UPDATE pgbaton.schema_version SET version = 103;

DROP TABLE pgbaton.cron_slot;
DROP TABLE pgbaton.job_run;
