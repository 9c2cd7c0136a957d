-- Leases: rows with an expiry by the database clock and a fencing token that
-- grows with every grant. Logged on purpose: an UNLOGGED table's sequence
-- would reset after a crash and tokens would go back (DESIGN rule 5).
CREATE SEQUENCE pgbaton.lease_token_seq AS bigint;

CREATE TABLE pgbaton.lease (
    name        text PRIMARY KEY CHECK (name <> '' AND octet_length(name) <= 255),
    -- "group" is reserved; NULL for standalone leases.
    lease_group text CHECK (lease_group <> '' AND octet_length(lease_group) <= 255),
    -- NULL when free.
    owner       text CHECK (owner <> '' AND octet_length(owner) <= 255),
    -- Last token granted for this name; kept after release and expiry so it
    -- only grows. NULL until the first grant.
    token       bigint,
    acquired_at timestamptz,
    renewed_at  timestamptz,
    -- NULL when free.
    expires_at  timestamptz,
    metadata    jsonb NOT NULL DEFAULT '{}',
    CONSTRAINT lease_held_has_expiry CHECK ((owner IS NULL) = (expires_at IS NULL))
);

ALTER SEQUENCE pgbaton.lease_token_seq OWNED BY pgbaton.lease.token;

COMMENT ON TABLE pgbaton.lease IS
    'pgbaton leases. (name, token) is valid iff owner IS NOT NULL AND token matches AND expires_at > clock_timestamp().';
