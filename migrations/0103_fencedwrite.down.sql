UPDATE pgbaton.schema_version SET version = 102;

-- Fails while tables still use the fence triggers (the functions are
-- never dropped with CASCADE): run pgbaton.disable_fencing on them first.
DROP FUNCTION pgbaton.prune_processed(interval,integer);
DROP FUNCTION pgbaton.mark_processed(text,text);
DROP TABLE pgbaton.processed_message;
DROP TABLE pgbaton.fenced_value;
DROP FUNCTION pgbaton.bypass_fencing(regclass,text);
DROP FUNCTION pgbaton.disable_fencing(regclass);
DROP FUNCTION pgbaton.enable_fencing(regclass);
DROP FUNCTION pgbaton.reject_stale_token();
DROP FUNCTION pgbaton.fencing_bypassed(oid,text);
DROP FUNCTION pgbaton.fence_token_set();
DROP FUNCTION pgbaton.present_token(bigint);
DROP FUNCTION pgbaton.assert_token(text,bigint);
DROP FUNCTION pgbaton.raise_stale_token(text,bigint,bigint,text);
