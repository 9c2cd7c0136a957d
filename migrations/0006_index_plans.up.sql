-- Plans that stay on the indexes whatever the statistics say.
--
-- pgbaton.lease is a queue and a lock table at once: it can hold eight
-- busy leases one minute and a burst of a million work items the next. The
-- planner sizes it from statistics taken at the last VACUUM or ANALYZE,
-- and plpgsql caches the plans per connection. After a VACUUM of a table
-- with a few live rows on many pages, a burst of 10k items was planned as
-- a table of 8 rows: claim picked and granted rows with sequential scans,
-- O(rows) per call, 2-4x slower at 10k rows (bench/, "Work items" after the
-- lease rows) and worse the deeper the queue. Every lookup below has an
-- index that is right at any size (primary key, lease_free_idx,
-- lease_held_idx, lease_waiter's key), so the functions do not let the
-- planner consider a sequential scan. The setting holds for the duration of
-- each call only.
ALTER FUNCTION pgbaton.lease_attempt(text, text, bigint, jsonb) SET enable_seqscan = off;
ALTER FUNCTION pgbaton.renew(text, text, bigint, bigint) SET enable_seqscan = off;
ALTER FUNCTION pgbaton.wait_for(text, text, boolean) SET enable_seqscan = off;
ALTER FUNCTION pgbaton.stop_waiting(text, text) SET enable_seqscan = off;
ALTER FUNCTION pgbaton.release(text, text, bigint) SET enable_seqscan = off;
ALTER FUNCTION pgbaton.complete(text, text, bigint) SET enable_seqscan = off;
ALTER FUNCTION pgbaton.register(text, text[]) SET enable_seqscan = off;
ALTER FUNCTION pgbaton.claim(text, text, integer, bigint) SET enable_seqscan = off;
ALTER FUNCTION pgbaton.assert_token(text, bigint) SET enable_seqscan = off;
ALTER FUNCTION pgbaton.force_release_lease(text, text) SET enable_seqscan = off;

-- complete_many deletes the rows of finished work items of p_owner in one
-- call, each guarded by its (name, token) like complete, and returns the
-- names deleted. Matching names and tokens as two sets is exact: every
-- token is granted to one row only. A function rather than a plain DELETE
-- so that it gets the setting above.
CREATE FUNCTION pgbaton.complete_many(p_names text[], p_tokens bigint[], p_owner text)
RETURNS SETOF text
LANGUAGE sql
SET enable_seqscan = off
AS $$
    DELETE FROM pgbaton.lease l
     WHERE l.name = ANY (p_names) AND l.token = ANY (p_tokens) AND l.owner = p_owner
    RETURNING l.name;
$$;
