UPDATE pgbaton.schema_version SET version = 104;

-- Take back this database's grants. The roles themselves are cluster-wide
-- and may be used by other databases: they stay.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgbaton_reader') THEN
        REVOKE ALL ON ALL TABLES IN SCHEMA pgbaton FROM pgbaton_reader;
        REVOKE ALL ON SCHEMA pgbaton FROM pgbaton_reader;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgbaton_admin') THEN
        REVOKE ALL ON ALL TABLES IN SCHEMA pgbaton FROM pgbaton_admin;
        REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgbaton FROM pgbaton_admin;
    END IF;
END $$;

DROP FUNCTION pgbaton.grant_roles();
DROP FUNCTION pgbaton.prune(text,interval,integer);
DROP FUNCTION pgbaton.terminate_advisory_holder(integer,text,text);
DROP FUNCTION pgbaton.force_release_lease(text,text,boolean);
DROP FUNCTION pgbaton.request_leader_resign(text,text);
DROP FUNCTION pgbaton.set_failover_grace(boolean,text);
DROP FUNCTION pgbaton.require_reason(text);
DROP FUNCTION pgbaton.require_admin(text);
DROP TABLE pgbaton.event;
