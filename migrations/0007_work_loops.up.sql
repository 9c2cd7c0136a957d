-- Work loops: claim order, batch release, completion inside the caller's
-- transaction.

-- Claim hands out the oldest available item first, whether it was never
-- held, released or expired: items keep the place in the queue they got at
-- registration. Without that, an expired item (a crashed worker's) was
-- claimed only once every never-claimed item was gone. seq never changes
-- after the row is made, so renewals, which touch no indexed column, stay
-- HOT updates.
CREATE SEQUENCE pgbaton.lease_seq AS bigint;
ALTER TABLE pgbaton.lease ADD COLUMN seq bigint;
UPDATE pgbaton.lease l SET seq = o.n
  FROM (SELECT name, row_number() OVER (ORDER BY acquired_at NULLS FIRST, name) AS n FROM pgbaton.lease) o
 WHERE o.name = l.name;
SELECT setval('pgbaton.lease_seq', coalesce((SELECT max(seq) FROM pgbaton.lease), 0) + 1, false);
ALTER TABLE pgbaton.lease
    ALTER COLUMN seq SET DEFAULT nextval('pgbaton.lease_seq'),
    ALTER COLUMN seq SET NOT NULL;
ALTER SEQUENCE pgbaton.lease_seq OWNED BY pgbaton.lease.seq;

DROP INDEX pgbaton.lease_free_idx;
DROP INDEX pgbaton.lease_held_idx;
CREATE INDEX lease_free_idx ON pgbaton.lease (lease_group, seq)
    WHERE lease_group IS NOT NULL AND owner IS NULL;
CREATE INDEX lease_held_idx ON pgbaton.lease (lease_group, seq)
    WHERE lease_group IS NOT NULL AND owner IS NOT NULL;

-- register keeps the order of p_names: the first name is claimed first.
CREATE OR REPLACE FUNCTION pgbaton.register(p_group text, p_names text[])
RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
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
    -- seq comes from the column default, drawn row by row in this order.
    INSERT INTO pgbaton.lease (name, lease_group)
    SELECT u.x, p_group
      FROM (SELECT DISTINCT ON (x) x, i FROM unnest(p_names) WITH ORDINALITY AS a(x, i) ORDER BY x, i) u
     ORDER BY u.i
    ON CONFLICT (name) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    SELECT l.name INTO bad FROM pgbaton.lease l
     WHERE l.name = ANY (p_names) AND l.lease_group IS DISTINCT FROM p_group LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'pgbaton: lease % exists outside group %', bad, p_group USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN n;
END $$;

-- claim grants owner up to n leases of group that are free (never held,
-- released) or expired, oldest first (by seq, the order of registration),
-- each with a new token, skipping rows other claims have locked (FOR UPDATE
-- SKIP LOCKED), so concurrent workers never wait on or get the same row.
-- Rows come back in that order.
CREATE OR REPLACE FUNCTION pgbaton.claim(p_group text, p_owner text, p_n integer, p_ttl_ms bigint)
RETURNS TABLE (name text, token bigint, expires_at timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    t      timestamptz;
    picked text[];
BEGIN
    PERFORM pgbaton.lease_check_args(p_group, p_owner, p_ttl_ms);
    IF p_n IS NULL OR p_n <= 0 THEN
        RAISE EXCEPTION 'pgbaton: claim n must be positive, got %', p_n USING ERRCODE = 'invalid_parameter_value';
    END IF;
    t := clock_timestamp();
    -- The oldest n free rows and the oldest n expired ones, each locked as
    -- it is found; the oldest n of both are granted. Rows locked but not
    -- granted stay as they were and are unlocked when this call's
    -- transaction ends.
    WITH free AS (
        SELECT l.name, l.seq FROM pgbaton.lease l
         WHERE l.lease_group = p_group AND l.owner IS NULL
         ORDER BY l.seq LIMIT p_n FOR UPDATE SKIP LOCKED
    ), expired AS (
        SELECT l.name, l.seq FROM pgbaton.lease l
         WHERE l.lease_group = p_group AND l.owner IS NOT NULL AND l.expires_at <= t
         ORDER BY l.seq LIMIT p_n FOR UPDATE SKIP LOCKED
    )
    SELECT array_agg(c.name ORDER BY c.seq) INTO picked
      FROM (SELECT a.name, a.seq FROM (SELECT * FROM free UNION ALL SELECT * FROM expired) a
             ORDER BY a.seq LIMIT p_n) c;
    IF picked IS NULL THEN
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
        RETURNING l.name, l.token, l.expires_at, l.seq)
    SELECT g.name, g.token, g.expires_at FROM granted g ORDER BY g.seq;
END $$;

-- release_many frees the leases of p_owner named in p_names, each guarded
-- by its token like release (matching the names and tokens as two sets is
-- exact: every token is granted to one row only), wakes their waiters and
-- returns the names freed. Clients give back many leases at once with it
-- (Close, a grant whose caller gave up).
CREATE FUNCTION pgbaton.release_many(p_names text[], p_tokens bigint[], p_owner text)
RETURNS SETOF text
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        UPDATE pgbaton.lease l
           SET owner = NULL, expires_at = NULL
         WHERE l.name = ANY (p_names) AND l.token = ANY (p_tokens) AND l.owner = p_owner
        RETURNING l.name, l.lease_group
    LOOP
        IF EXISTS (SELECT 1 FROM pgbaton.lease_waiter w WHERE w.name = r.name) THEN
            PERFORM pg_notify('pgbaton_lease', r.name);
        END IF;
        IF r.lease_group IS NOT NULL AND EXISTS (SELECT 1 FROM pgbaton.lease_waiter w WHERE w.name = r.lease_group) THEN
            PERFORM pg_notify('pgbaton_lease', r.lease_group);
        END IF;
        RETURN NEXT r.name;
    END LOOP;
END $$;

-- complete_tx completes work items inside the caller's transaction: it
-- deletes the rows of p_owner's leases (names and tokens as in
-- release_many), or, if any of them is no longer held with its token
-- (taken over, released, completed), deletes nothing and raises PB001,
-- which aborts the caller's transaction: the work's effects and the
-- completion commit together or not at all. Expiry alone does not fail it:
-- nobody else can have worked on an item whose token did not move, and the
-- row lock taken here keeps claimers off it until the transaction ends.
CREATE FUNCTION pgbaton.complete_tx(p_names text[], p_tokens bigint[], p_owner text)
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    missing text[];
    cur_token bigint;
BEGIN
    IF p_names IS NULL OR p_tokens IS NULL OR cardinality(p_names) <> cardinality(p_tokens) OR cardinality(p_names) = 0 THEN
        RAISE EXCEPTION 'pgbaton: complete_tx needs as many names as tokens, at least one' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH gone AS (
        DELETE FROM pgbaton.lease l
         WHERE l.name = ANY (p_names) AND l.token = ANY (p_tokens) AND l.owner = p_owner
        RETURNING l.name)
    SELECT array_agg(n ORDER BY n) INTO missing
      FROM unnest(p_names) n WHERE n NOT IN (SELECT g.name FROM gone g);
    IF missing IS NOT NULL THEN
        SELECT l.token INTO cur_token FROM pgbaton.lease l WHERE l.name = missing[1];
        RAISE EXCEPTION 'pgbaton: not completed: leases % are no longer held with their tokens (taken over, released or completed)', missing
            USING ERRCODE = 'PB001',
                  DETAIL = format('presented=%s current=%s reason=%s name=%s',
                                  p_tokens[array_position(p_names, missing[1])], coalesce(cur_token, 0), 'not held', missing[1]),
                  HINT = 'Roll back: the work was done under a lease that moved on; another holder does it again.';
    END IF;
END $$;
