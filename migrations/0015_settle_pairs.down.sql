-- Back to 0014's settle_many.
CREATE OR REPLACE FUNCTION pgbaton.settle_many(p_names text[], p_tokens bigint[], p_owner text)
RETURNS TABLE (name text, state text)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    present  text[];
    unlocked text[];
    freed    text[];
BEGIN
    present := ARRAY(
        SELECT l.name FROM pgbaton.lease l JOIN unnest(p_names, p_tokens) AS g(name, token)
            ON l.name = g.name AND l.token = g.token
         WHERE l.owner = p_owner);
    unlocked := ARRAY(
        SELECT l.name FROM pgbaton.lease l JOIN unnest(p_names, p_tokens) AS g(name, token)
            ON l.name = g.name AND l.token = g.token
         WHERE l.owner = p_owner AND l.name = ANY (present)
           FOR UPDATE OF l SKIP LOCKED);
    freed := ARRAY(SELECT pgbaton.release_many(unlocked, p_tokens, p_owner));
    RETURN QUERY
    SELECT n, CASE WHEN n = ANY (freed) THEN 'released' WHEN n = ANY (present) THEN 'busy' ELSE 'gone' END
      FROM unnest(p_names) n;
END $$;
