-- 0015: settle_many gives back each rolled-back lease with its own token.
-- 0014 passed the names it could lock beside every token it was given, and
-- release_many pairs names and tokens by position: when one lease of the
-- batch was gone or locked, the others were paired with the wrong tokens,
-- freed nothing and stayed 'busy' until their session died.
CREATE OR REPLACE FUNCTION pgbaton.settle_many(p_names text[], p_tokens bigint[], p_owner text)
RETURNS TABLE (name text, state text)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    present   text[];
    un_names  text[];
    un_tokens bigint[];
    freed     text[];
BEGIN
    present := ARRAY(
        SELECT l.name FROM pgbaton.lease l JOIN unnest(p_names, p_tokens) AS g(name, token)
            ON l.name = g.name AND l.token = g.token
         WHERE l.owner = p_owner);
    SELECT coalesce(array_agg(u.name ORDER BY u.name), '{}'), coalesce(array_agg(u.token ORDER BY u.name), '{}')
      INTO un_names, un_tokens
      FROM (SELECT l.name, l.token FROM pgbaton.lease l JOIN unnest(p_names, p_tokens) AS g(name, token)
                ON l.name = g.name AND l.token = g.token
             WHERE l.owner = p_owner AND l.name = ANY (present)
               FOR UPDATE OF l SKIP LOCKED) u;
    freed := ARRAY(SELECT pgbaton.release_many(un_names, un_tokens, p_owner));
    RETURN QUERY
    SELECT n, CASE WHEN n = ANY (freed) THEN 'released' WHEN n = ANY (present) THEN 'busy' ELSE 'gone' END
      FROM unnest(p_names) n;
END $$;
