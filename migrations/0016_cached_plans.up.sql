-- 0016: statements inside pgbaton's functions keep their plans.
--
-- 1. The LANGUAGE sql functions Postgres cannot inline become plpgsql.
--    Before Postgres 18 a SQL function that is not inlined (a SET clause,
--    SECURITY DEFINER, or a body that is not a SELECT rules inlining out)
--    is parsed and planned again at every call; plpgsql keeps its plans
--    for the session. Same bodies, same results.
-- 2. The functions whose statements join or match array parameters (and
--    claim, whose grant matches the names it picked) use the generic plan.
--    Postgres guesses an array's size for the generic plan and then finds
--    it costlier than a custom plan for the one or two names of a typical
--    call, so it planned those statements again at every call: 40-70 µs
--    each, with complete_many a third of a one-item CompleteAndClaim. The
--    generic plans are the index plans the custom ones were (enable_seqscan
--    stays off in all of them).

CREATE OR REPLACE FUNCTION pgbaton.complete_many(p_names text[], p_tokens bigint[], p_owner text)
RETURNS SETOF text
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    DELETE FROM pgbaton.lease l
     USING unnest(p_names, p_tokens) AS g(name, token)
     WHERE l.name = g.name AND l.token = g.token AND l.owner = p_owner
    RETURNING l.name;
END $$;

CREATE OR REPLACE FUNCTION pgbaton.held_grants(p_names text[], p_tokens bigint[], p_owner text)
RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    SELECT l.name FROM pgbaton.lease l JOIN unnest(p_names, p_tokens) AS g(name, token)
        ON l.name = g.name AND l.token = g.token
     WHERE l.owner = p_owner;
END $$;

CREATE OR REPLACE FUNCTION pgbaton.session_lost(p_session bigint, p_names text[], p_tokens bigint[], p_owner text)
RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    SELECT g.name FROM unnest(p_names, p_tokens) AS g(name, token)
     WHERE NOT EXISTS (
        SELECT 1 FROM pgbaton.lease l
         WHERE l.name = g.name AND l.token = g.token AND l.owner = p_owner AND l.session_id = p_session);
END $$;

CREATE OR REPLACE FUNCTION pgbaton.stop_waiting(p_name text, p_waiter text)
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
    DELETE FROM pgbaton.lease_waiter w WHERE w.name = p_name AND w.waiter = p_waiter;
END $$;

CREATE OR REPLACE FUNCTION pgbaton.fencing_bypassed(p_relid oid, p_events text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN EXISTS (
        SELECT FROM pgbaton.event e
         WHERE e.id = ANY (string_to_array(p_events, ',')::bigint[])
           AND e.action = 'bypass_fencing'
           AND e.detail->>'xid' = txid_current()::text
           AND (e.detail->>'relid')::oid IN (SELECT p_relid UNION ALL SELECT a.relid FROM pg_partition_ancestors(p_relid) a));
END $$;

ALTER FUNCTION pgbaton.claim(text, text, integer, bigint, bigint, uuid, boolean) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgbaton.complete_many(text[], bigint[], text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgbaton.complete_tx(text[], bigint[], text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgbaton.release_many(text[], bigint[], text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgbaton.settle_many(text[], bigint[], text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgbaton.held_grants(text[], bigint[], text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgbaton.session_lost(bigint, text[], bigint[], text) SET plan_cache_mode = force_generic_plan;
