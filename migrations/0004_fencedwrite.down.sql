-- No CASCADE: this fails while a user table still has the trigger that
-- pgbaton.enable_fencing installed (run pgbaton.disable_fencing first),
-- rather than silently removing that table's protection.
DROP TABLE pgbaton.fenced_value;
DROP FUNCTION pgbaton.disable_fencing(regclass);
DROP FUNCTION pgbaton.enable_fencing(regclass);
DROP FUNCTION pgbaton.reject_stale_token();
DROP FUNCTION pgbaton.assert_token(text, bigint);
DROP FUNCTION pgbaton.raise_stale_token(text, bigint, bigint, text);
