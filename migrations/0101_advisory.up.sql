-- Advisory locks: the SQL twin of advisory.Name and the name registry.

-- advisory_key maps a lock name to the 64-bit key advisory.Name uses in Go:
-- the first 8 bytes of SHA-256 over the UTF-8 name (prefixed with
-- "namespace/" when a namespace is given), read as a big-endian signed
-- bigint. SHA-256 rather than hashtextextended: its result is the same on
-- every server version and CPU byte order, and it is allowed in FIPS mode.
--   SELECT pg_advisory_lock(pgbaton.advisory_key('job:daily-export'));
CREATE FUNCTION pgbaton.advisory_key(name text, namespace text DEFAULT '')
RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT ('x' || encode(substr(sha256(convert_to(
               CASE WHEN namespace = '' THEN name ELSE namespace || '/' || name END,
               'UTF8')), 1, 8), 'hex'))::bit(64)::bigint
$$;

COMMENT ON FUNCTION pgbaton.advisory_key(text, text) IS
    'pgbaton: the 64-bit advisory lock key of a lock name, as advisory.Name computes it in Go';

-- advisory_name records every name locked through pgbaton, so that tools can
-- show names instead of numbers. The key is the primary key: a second name
-- with the same key is a collision, which advisory reports instead of
-- locking.
CREATE TABLE pgbaton.advisory_name (
    key        bigint      PRIMARY KEY,
    namespace  text        NOT NULL DEFAULT '',
    name       text        NOT NULL,
    first_seen timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_seen  timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT advisory_name_key_matches CHECK (key = pgbaton.advisory_key(name, namespace)),
    CONSTRAINT advisory_name_name_length CHECK (octet_length(name) BETWEEN 1 AND 1024),
    CONSTRAINT advisory_name_namespace_length CHECK (octet_length(namespace) <= 255 AND strpos(namespace, '/') = 0)
);

COMMENT ON TABLE pgbaton.advisory_name IS
    'pgbaton: names of advisory locks taken through pgbaton (key = pgbaton.advisory_key(name, namespace))';

CREATE INDEX advisory_name_last_seen_idx ON pgbaton.advisory_name (last_seen);

UPDATE pgbaton.schema_version SET version = 101;
