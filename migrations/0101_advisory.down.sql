UPDATE pgbaton.schema_version SET version = 100;

DROP TABLE pgbaton.advisory_name;
DROP FUNCTION pgbaton.advisory_key(text,text);
