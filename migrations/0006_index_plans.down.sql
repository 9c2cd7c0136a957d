DROP FUNCTION pgbaton.complete_many(text[], bigint[], text);

ALTER FUNCTION pgbaton.lease_attempt(text, text, bigint, jsonb) RESET enable_seqscan;
ALTER FUNCTION pgbaton.renew(text, text, bigint, bigint) RESET enable_seqscan;
ALTER FUNCTION pgbaton.wait_for(text, text, boolean) RESET enable_seqscan;
ALTER FUNCTION pgbaton.stop_waiting(text, text) RESET enable_seqscan;
ALTER FUNCTION pgbaton.release(text, text, bigint) RESET enable_seqscan;
ALTER FUNCTION pgbaton.complete(text, text, bigint) RESET enable_seqscan;
ALTER FUNCTION pgbaton.register(text, text[]) RESET enable_seqscan;
ALTER FUNCTION pgbaton.claim(text, text, integer, bigint) RESET enable_seqscan;
ALTER FUNCTION pgbaton.assert_token(text, bigint) RESET enable_seqscan;
ALTER FUNCTION pgbaton.force_release_lease(text, text) RESET enable_seqscan;
