ALTER FUNCTION pgbaton.claim(text, text, integer, bigint, bigint, uuid, boolean) RESET plan_cache_mode;
ALTER FUNCTION pgbaton.complete_tx(text[], bigint[], text) RESET plan_cache_mode;
ALTER FUNCTION pgbaton.release_many(text[], bigint[], text) RESET plan_cache_mode;
ALTER FUNCTION pgbaton.settle_many(text[], bigint[], text) RESET plan_cache_mode;

-- Back to the LANGUAGE sql versions (which replace the settings too): complete_many and held_grants (0014),
-- session_lost (0011), stop_waiting (0003, SET in 0006), fencing_bypassed
-- (0008).

CREATE OR REPLACE FUNCTION pgbaton.complete_many(p_names text[], p_tokens bigint[], p_owner text)
RETURNS SETOF text
LANGUAGE sql
SET enable_seqscan = off
AS $$
    DELETE FROM pgbaton.lease l
     USING unnest(p_names, p_tokens) AS g(name, token)
     WHERE l.name = g.name AND l.token = g.token AND l.owner = p_owner
    RETURNING l.name;
$$;

CREATE OR REPLACE FUNCTION pgbaton.held_grants(p_names text[], p_tokens bigint[], p_owner text)
RETURNS SETOF text
LANGUAGE sql STABLE
SET enable_seqscan = off
AS $$
    SELECT l.name FROM pgbaton.lease l JOIN unnest(p_names, p_tokens) AS g(name, token)
        ON l.name = g.name AND l.token = g.token
     WHERE l.owner = p_owner
$$;

CREATE OR REPLACE FUNCTION pgbaton.session_lost(p_session bigint, p_names text[], p_tokens bigint[], p_owner text)
RETURNS SETOF text
LANGUAGE sql STABLE
SET enable_seqscan = off
AS $$
    SELECT g.name FROM unnest(p_names, p_tokens) AS g(name, token)
     WHERE NOT EXISTS (
        SELECT 1 FROM pgbaton.lease l
         WHERE l.name = g.name AND l.token = g.token AND l.owner = p_owner AND l.session_id = p_session)
$$;

CREATE OR REPLACE FUNCTION pgbaton.stop_waiting(p_name text, p_waiter text)
RETURNS void
LANGUAGE sql
SET enable_seqscan = off
AS $$
    DELETE FROM pgbaton.lease_waiter w WHERE w.name = p_name AND w.waiter = p_waiter
$$;

CREATE OR REPLACE FUNCTION pgbaton.fencing_bypassed(p_relid oid, p_events text)
RETURNS boolean
LANGUAGE sql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (
        SELECT FROM pgbaton.event e
         WHERE e.id = ANY (string_to_array(p_events, ',')::bigint[])
           AND e.action = 'bypass_fencing'
           AND e.detail->>'xid' = txid_current()::text
           AND (e.detail->>'relid')::oid IN (SELECT p_relid UNION ALL SELECT a.relid FROM pg_partition_ancestors(p_relid) a));
$$;
