DROP FUNCTION pgbaton.complete_tx(text[], bigint[], text);
DROP FUNCTION pgbaton.release_many(text[], bigint[], text);

-- register and claim as migration 0003 made them (with 0006's setting).
CREATE OR REPLACE FUNCTION pgbaton.register(p_group text, p_names text[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    bad text;
BEGIN
    IF p_group IS NULL OR p_group = '' OR octet_length(p_group) > 255 THEN
        RAISE EXCEPTION 'pgbaton: lease group must be 1 to 255 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_names IS NULL OR EXISTS (SELECT 1 FROM unnest(p_names) x WHERE x IS NULL OR x = '' OR octet_length(x) > 255) THEN
        RAISE EXCEPTION 'pgbaton: lease names must be 1 to 255 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pgbaton.lease (name, lease_group)
    SELECT DISTINCT x, p_group FROM unnest(p_names) x
    ON CONFLICT (name) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    SELECT l.name INTO bad FROM pgbaton.lease l
     WHERE l.name = ANY (p_names) AND l.lease_group IS DISTINCT FROM p_group LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'pgbaton: lease % exists outside group %', bad, p_group USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN n;
END $$;

CREATE OR REPLACE FUNCTION pgbaton.claim(p_group text, p_owner text, p_n integer, p_ttl_ms bigint)
RETURNS TABLE (name text, token bigint, expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    t      timestamptz;
    picked text[];
BEGIN
    PERFORM pgbaton.lease_check_args(p_group, p_owner, p_ttl_ms);
    IF p_n IS NULL OR p_n <= 0 THEN
        RAISE EXCEPTION 'pgbaton: claim n must be positive, got %', p_n USING ERRCODE = 'invalid_parameter_value';
    END IF;
    t := clock_timestamp();
    picked := ARRAY(
        SELECT l.name FROM pgbaton.lease l
         WHERE l.lease_group = p_group AND l.owner IS NULL
         LIMIT p_n FOR UPDATE SKIP LOCKED);
    IF cardinality(picked) < p_n THEN
        picked := picked || ARRAY(
            SELECT l.name FROM pgbaton.lease l
             WHERE l.lease_group = p_group AND l.owner IS NOT NULL AND l.expires_at <= t
             LIMIT p_n - cardinality(picked) FOR UPDATE SKIP LOCKED);
    END IF;
    IF cardinality(picked) = 0 THEN
        RETURN;
    END IF;
    t := clock_timestamp();
    -- The rows are locked by the selects above, so each token is drawn under
    -- its row's lock.
    RETURN QUERY
    WITH granted AS (
        UPDATE pgbaton.lease l
           SET owner = p_owner, token = nextval('pgbaton.lease_token_seq'),
               acquired_at = t, renewed_at = t, expires_at = t + p_ttl_ms * interval '1 millisecond'
         WHERE l.name = ANY (picked)
        RETURNING l.name, l.token, l.expires_at)
    SELECT g.name, g.token, g.expires_at FROM granted g ORDER BY g.name;
END $$;

ALTER FUNCTION pgbaton.register(text, text[]) SET enable_seqscan = off;
ALTER FUNCTION pgbaton.claim(text, text, integer, bigint) SET enable_seqscan = off;

DROP INDEX pgbaton.lease_free_idx;
DROP INDEX pgbaton.lease_held_idx;
CREATE INDEX lease_free_idx ON pgbaton.lease (lease_group, name)
    WHERE lease_group IS NOT NULL AND owner IS NULL;
CREATE INDEX lease_held_idx ON pgbaton.lease (lease_group)
    WHERE lease_group IS NOT NULL AND owner IS NOT NULL;
ALTER TABLE pgbaton.lease DROP COLUMN seq;
