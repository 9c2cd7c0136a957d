DROP TABLE pgbaton.advisory_name;
DROP FUNCTION pgbaton.advisory_key(text,text);
