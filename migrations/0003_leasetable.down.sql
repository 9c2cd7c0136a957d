DROP TABLE pgbaton.lease;
