-- Operator roles, the audit log, and forced release.
--
-- Roles are cluster-wide, so they are created only when missing, and only
-- when the migrating user may create roles; otherwise a DBA creates them
-- (CREATE ROLE pgbaton_reader; CREATE ROLE pgbaton_admin IN ROLE
-- pgbaton_reader;) and runs SELECT pgbaton.grant_roles().
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['pgbaton_reader', 'pgbaton_admin'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION
                WHEN insufficient_privilege THEN
                    RAISE NOTICE 'pgbaton: cannot create role % (needs CREATEROLE); a DBA must create it and run SELECT pgbaton.grant_roles()', r;
                WHEN duplicate_object OR unique_violation THEN
                    NULL; -- created at the same moment from another database
            END;
        END IF;
    END LOOP;
END $$;

-- The audit log: one row per forced release, fence bypass or request that
-- a leader resign, written in the same transaction as the action itself.
CREATE TABLE pgbaton.event (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor     text NOT NULL DEFAULT current_user,
    action    text NOT NULL CHECK (action IN ('force_release_lease', 'terminate_advisory_holder', 'bypass_fencing',
                                            'set_failover_grace', 'request_resign')),
    target    text NOT NULL,
    reason    text NOT NULL CHECK (btrim(reason) <> ''),
    old_token bigint,
    new_token bigint,
    detail    jsonb NOT NULL DEFAULT '{}'
);

COMMENT ON TABLE pgbaton.event IS 'pgbaton audit log: forced releases, who did them and why';

CREATE INDEX event_at_idx ON pgbaton.event (at);

-- require_admin raises insufficient_privilege, naming the role, unless the
-- current user is a superuser or a member of pgbaton_admin.
CREATE FUNCTION pgbaton.require_admin(p_what text)
RETURNS void LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgbaton_admin')
       AND pg_has_role(current_user, 'pgbaton_admin', 'MEMBER') THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'pgbaton: % needs role pgbaton_admin; user % is not a member', p_what, current_user
        USING ERRCODE = 'insufficient_privilege', HINT = format('GRANT pgbaton_admin TO %I;', current_user);
END $$;

CREATE FUNCTION pgbaton.require_reason(p_reason text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_reason IS NULL OR btrim(p_reason) = '' THEN
        RAISE EXCEPTION 'pgbaton: a forced release needs a reason' USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- force_release_lease frees a held lease whoever holds it, draws a new token
-- so that the old holder's fenced writes fail from now on, wakes waiters and
-- writes the audit row, all in the caller's transaction. SQLSTATE PB404
-- when there is no such lease or it is not held. A lease kept by its
-- session's keep-alive counts as held; it is unbound from the session, and
-- the session's client is told (revoked).
--
-- A grant with a lock-delay (lease.lock_delay_ms) is lost, not released:
-- its holder may still be finishing writes, so by default the name is not
-- granted again before the delay has passed from now (its row keeps the
-- old owner and the new token, expired now; lock_delay_until says until
-- when). p_clear_delay frees it at once instead, and also ends the
-- lock-delay of a grant lost before (expired, not held any more), which is
-- otherwise PB404 like any lease not held.
CREATE FUNCTION pgbaton.force_release_lease(p_name text, p_reason text, p_clear_delay boolean DEFAULT false)
RETURNS TABLE (old_owner text, old_token bigint, new_token bigint, lock_delay_until timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    cur     pgbaton.lease%ROWTYPE;
    se      timestamptz;
    held    boolean;
    delayed boolean;
    keep    boolean;
BEGIN
    PERFORM pgbaton.require_admin('force-releasing a lease');
    PERFORM pgbaton.require_reason(p_reason);
    SELECT * INTO cur FROM pgbaton.lease l WHERE l.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgbaton: no lease named %', p_name USING ERRCODE = 'PB404';
    END IF;
    se := pgbaton.session_expiry(cur.session_id);
    held := coalesce(pgbaton.lease_expiry(cur.expires_at, se) > clock_timestamp(), false);
    delayed := NOT held AND coalesce(pgbaton.lease_free_at(cur.expires_at, se, cur.lock_delay_ms) > clock_timestamp(), false);
    IF NOT held AND NOT (delayed AND coalesce(p_clear_delay, false)) THEN
        IF delayed THEN
            RAISE EXCEPTION 'pgbaton: lease % is not held; it is in lock-delay until %', p_name,
                pgbaton.lease_free_at(cur.expires_at, se, cur.lock_delay_ms)
                USING ERRCODE = 'PB404', HINT = 'Pass clear_delay to end the lock-delay now.';
        END IF;
        RAISE EXCEPTION 'pgbaton: lease % is not held', p_name USING ERRCODE = 'PB404';
    END IF;
    keep := held AND cur.lock_delay_ms > 0 AND NOT coalesce(p_clear_delay, false);
    UPDATE pgbaton.lease l
       SET owner = CASE WHEN keep THEN l.owner END,
           expires_at = CASE WHEN keep THEN clock_timestamp() END,
           session_id = NULL, token = pgbaton.next_token()
     WHERE l.name = p_name
    RETURNING l.token, pgbaton.lease_free_at(l.expires_at, NULL, l.lock_delay_ms) INTO new_token, lock_delay_until;
    IF cur.session_id IS NOT NULL AND held THEN
        UPDATE pgbaton.lease_session s SET revoked = s.revoked + 1 WHERE s.id = cur.session_id;
    END IF;
    old_owner := cur.owner;
    old_token := cur.token;
    INSERT INTO pgbaton.event (action, target, reason, old_token, new_token, detail)
    VALUES ('force_release_lease', p_name, p_reason, cur.token, new_token,
            jsonb_build_object('owner', cur.owner, 'group', cur.lease_group, 'session', cur.session_id,
                               'acquired_at', cur.acquired_at,
                               'expires_at', pgbaton.lease_expiry(cur.expires_at, se),
                               'lock_delay_ms', cur.lock_delay_ms, 'lock_delay_until', lock_delay_until,
                               'lock_delay_cleared', delayed OR (held AND cur.lock_delay_ms > 0 AND NOT keep)));
    IF cur.lease_group IS NOT NULL THEN
        PERFORM pgbaton.group_gate(cur.lease_group, false);
    END IF;
    -- A lease kept in lock-delay wakes the head of its queue too
    -- (notify_waiters wakes it for a lease not held): it learns the
    -- delay's end, which may come before the expiry it was waiting for.
    PERFORM pgbaton.notify_waiters(ARRAY[p_name, cur.lease_group]);
    RETURN NEXT;
END $$;

-- request_leader_resign asks the leader of election p_name to step down
-- (pgbaton.request_resign: it finishes its term and the next candidate
-- takes over) and writes the audit row, in the caller's transaction; it
-- returns the leader and its term. SQLSTATE PB404 when the election has no
-- leader.
CREATE FUNCTION pgbaton.request_leader_resign(p_name text, p_reason text)
RETURNS TABLE (leader text, term bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
    PERFORM pgbaton.require_admin('asking a leader to resign');
    PERFORM pgbaton.require_reason(p_reason);
    term := pgbaton.request_resign(p_name, p_reason, current_user);
    IF term IS NULL THEN
        RAISE EXCEPTION 'pgbaton: election % has no leader', p_name USING ERRCODE = 'PB404';
    END IF;
    SELECT l.owner INTO leader FROM pgbaton.lease l WHERE l.name = p_name;
    INSERT INTO pgbaton.event (action, target, reason, old_token, detail)
    VALUES ('request_resign', p_name, p_reason, term, jsonb_build_object('owner', leader));
    RETURN NEXT;
END $$;

-- set_failover_grace turns the failover grace (0102_leasetable, "No two
-- holders across a lossy failover") on or off for this database and
-- writes the audit row; it returns whether it was on. Turn it off only
-- where a failover cannot lose an acknowledged grant (synchronous
-- replication, synchronous_commit on or remote_apply), or to end a grace
-- now knowing that holders of lost grants may still be working. The
-- setting is replicated, so it holds on the standbys once promoted.
CREATE FUNCTION pgbaton.set_failover_grace(p_on boolean, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    was boolean;
BEGIN
    PERFORM pgbaton.require_admin('setting the failover grace');
    PERFORM pgbaton.require_reason(p_reason);
    IF p_on IS NULL THEN
        RAISE EXCEPTION 'pgbaton: the failover grace is on or off, not NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT t.grace INTO was FROM pgbaton.token_epoch t WHERE t.one FOR UPDATE;
    UPDATE pgbaton.token_epoch t SET grace = p_on WHERE t.one;
    INSERT INTO pgbaton.event (action, target, reason, detail)
    SELECT 'set_failover_grace', 'failover_grace', p_reason,
           jsonb_build_object('was', was, 'now', p_on, 'grace_until', t.grace_until, 'timeline', t.timeline)
      FROM pgbaton.token_epoch t;
    IF was AND NOT p_on THEN
        -- A grace in force ends now: wake every waiter (the empty payload
        -- names no lease; a client's listener wakes all its waiters on it).
        -- Sent at commit, to everyone who listened before, so no waiter
        -- that looked before this committed sleeps to the old grace's end.
        PERFORM pg_notify('pgbaton_lease', '');
    END IF;
    RETURN was;
END $$;

-- terminate_advisory_holder ends backend p_pid, which frees every advisory
-- lock it holds, after recording them all in the audit row. p_target names
-- the lock the operator meant (key or name) for the log. SQLSTATE PB404
-- when the backend holds no advisory lock in this database.
CREATE FUNCTION pgbaton.terminate_advisory_holder(p_pid integer, p_target text, p_reason text)
RETURNS TABLE (terminated boolean, locks_held integer)
LANGUAGE plpgsql AS $$
DECLARE
    held jsonb;
BEGIN
    PERFORM pgbaton.require_admin('terminating a lock holder');
    PERFORM pgbaton.require_reason(p_reason);
    SELECT jsonb_agg(jsonb_build_object('classid', l.classid, 'objid', l.objid, 'objsubid', l.objsubid, 'mode', l.mode)),
           count(*)
      INTO held, locks_held
      FROM pg_catalog.pg_locks l
     WHERE l.pid = p_pid AND l.locktype = 'advisory' AND l.granted
       AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database());
    IF locks_held = 0 THEN
        RAISE EXCEPTION 'pgbaton: backend % holds no advisory lock in this database', p_pid USING ERRCODE = 'PB404';
    END IF;
    INSERT INTO pgbaton.event (action, target, reason, detail)
    SELECT 'terminate_advisory_holder', p_target, p_reason,
           jsonb_build_object('pid', p_pid, 'locks', held, 'application_name', a.application_name,
                              'client_addr', host(a.client_addr), 'usename', a.usename)
      FROM (SELECT 1) one LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = p_pid;
    terminated := pg_terminate_backend(p_pid);
    RETURN NEXT;
END $$;

-- Retention: every table that grows with use has a rule that bounds it,
-- applied in small batches (pgbaton.prune, one table per call) by one
-- client at a time (the pruner holds the lease "pgbaton:retention" while
-- it prunes: leasetable's Client for its own tables, retention.Run for the
-- others). Each rule deletes the oldest rows first, up to p_batch,
-- skipping rows somebody else has locked, so a call is short and never
-- waits.
--
--   table              rule (default in leasetable.Retention or retention.Config)
--   cron_slot          slots scheduled longer ago than the retention (7 days)
--   job_run            finished runs older than the retention (30 days),
--                      except the newest run of each job
--   event              audit rows older than the retention (365 days)
--   lease_waiter       registrations older than the retention (1 day): a
--                      waiter that crashed never removed its own
--   fenced_value       values not written for the retention (90 days)
--   advisory_name      names not registered for the retention (90 days)
--   processed_message  as pgbaton.prune_processed (7 days)
--   lease              leases without a group (named, not work items)
--                      neither held nor granted for the retention (7 days);
--                      a later grant makes a new row with a larger token
--   lease_session      sessions dead for the retention (1 minute)
--
-- Work items are deleted when completed; registered items, shards and
-- semaphore slots (leases with a group) are never pruned.
--
-- prune deletes up to p_batch rows of p_table older than p_older_than by
-- its rule (above) and returns how many it deleted.
CREATE FUNCTION pgbaton.prune(p_table text, p_older_than interval, p_batch integer)
RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    cutoff timestamptz;
    n      integer;
BEGIN
    IF p_older_than IS NULL OR p_older_than <= interval '0' THEN
        RAISE EXCEPTION 'pgbaton: retention must be positive, got %', p_older_than USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
        RAISE EXCEPTION 'pgbaton: batch must be 1 to 100000, got %', p_batch USING ERRCODE = 'invalid_parameter_value';
    END IF;
    cutoff := clock_timestamp() - p_older_than;
    CASE p_table
    WHEN 'cron_slot' THEN
        DELETE FROM pgbaton.cron_slot c USING (
            SELECT s.job, s.scheduled_at FROM pgbaton.cron_slot s
             WHERE s.scheduled_at < cutoff ORDER BY s.scheduled_at LIMIT p_batch FOR UPDATE SKIP LOCKED) o
         WHERE c.job = o.job AND c.scheduled_at = o.scheduled_at;
    WHEN 'job_run' THEN
        DELETE FROM pgbaton.job_run r USING (
            SELECT j.id FROM pgbaton.job_run j
             WHERE j.finished_at < cutoff
               AND EXISTS (SELECT 1 FROM pgbaton.job_run k WHERE k.job = j.job AND k.id > j.id)
             ORDER BY j.finished_at LIMIT p_batch FOR UPDATE SKIP LOCKED) o
         WHERE r.id = o.id;
    WHEN 'event' THEN
        DELETE FROM pgbaton.event e USING (
            SELECT v.id FROM pgbaton.event v
             WHERE v.at < cutoff ORDER BY v.at LIMIT p_batch FOR UPDATE SKIP LOCKED) o
         WHERE e.id = o.id;
    WHEN 'lease_waiter' THEN
        DELETE FROM pgbaton.lease_waiter w USING (
            SELECT x.name, x.waiter FROM pgbaton.lease_waiter x
             WHERE x.since < cutoff ORDER BY x.since LIMIT p_batch FOR UPDATE SKIP LOCKED) o
         WHERE w.name = o.name AND w.waiter = o.waiter;
    WHEN 'fenced_value' THEN
        DELETE FROM pgbaton.fenced_value f USING (
            SELECT v.key FROM pgbaton.fenced_value v
             WHERE v.updated_at < cutoff ORDER BY v.updated_at LIMIT p_batch FOR UPDATE SKIP LOCKED) o
         WHERE f.key = o.key;
    WHEN 'advisory_name' THEN
        DELETE FROM pgbaton.advisory_name a USING (
            SELECT x.key FROM pgbaton.advisory_name x
             WHERE x.last_seen < cutoff ORDER BY x.last_seen LIMIT p_batch FOR UPDATE SKIP LOCKED) o
         WHERE a.key = o.key;
    WHEN 'processed_message' THEN
        RETURN pgbaton.prune_processed(p_older_than, p_batch);
    WHEN 'lease' THEN
        -- Never granted since the cutoff, and not held now (released, or
        -- its grant and session long expired).
        DELETE FROM pgbaton.lease l USING (
            SELECT x.name FROM pgbaton.lease x
             WHERE x.lease_group IS NULL AND coalesce(x.acquired_at, '-infinity') < cutoff
               AND (x.owner IS NULL OR pgbaton.lease_expiry(x.expires_at, pgbaton.session_expiry(x.session_id)) < cutoff)
             ORDER BY x.acquired_at LIMIT p_batch FOR UPDATE SKIP LOCKED) o
         WHERE l.name = o.name;
    WHEN 'lease_session' THEN
        RETURN pgbaton.prune_sessions(p_older_than, p_batch);
    ELSE
        RAISE EXCEPTION 'pgbaton: no retention rule for table %', p_table USING ERRCODE = 'invalid_parameter_value';
    END CASE;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

COMMENT ON FUNCTION pgbaton.prune(text, interval, integer) IS
    'pgbaton: delete up to p_batch rows of p_table older than p_older_than by its retention rule; returns the count';

-- grant_roles gives pgbaton_reader read access to every pgbaton table and
-- pgbaton_admin what forced release needs. Run it again after creating the
-- roles by hand. Grants of predefined roles are skipped when the current
-- user may not give them.
-- pgbaton_admin may draw a token (force_release_lease does); the epoch
-- it carries is computed, not written (pgbaton.token_epoch_now).
CREATE FUNCTION pgbaton.grant_roles()
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgbaton_reader')
       OR NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgbaton_admin') THEN
        RAISE NOTICE 'pgbaton: roles pgbaton_reader and pgbaton_admin do not exist; no grants made';
        RETURN;
    END IF;
    GRANT USAGE ON SCHEMA pgbaton TO pgbaton_reader;
    GRANT SELECT ON ALL TABLES IN SCHEMA pgbaton TO pgbaton_reader;
    GRANT UPDATE ON pgbaton.lease TO pgbaton_admin;
    GRANT UPDATE ON pgbaton.lease_session TO pgbaton_admin;
    GRANT INSERT ON pgbaton.event TO pgbaton_admin;
    GRANT INSERT, UPDATE ON pgbaton.lease_resign TO pgbaton_admin;
    GRANT UPDATE (grace) ON pgbaton.token_epoch TO pgbaton_admin;
    GRANT USAGE ON SEQUENCE pgbaton.lease_token_seq TO pgbaton_admin;
    BEGIN
        GRANT pgbaton_reader TO pgbaton_admin;
        GRANT pg_read_all_stats TO pgbaton_reader;
        GRANT pg_signal_backend TO pgbaton_admin;
    EXCEPTION WHEN insufficient_privilege OR invalid_grant_operation THEN
        RAISE NOTICE 'pgbaton: could not grant role memberships (%); a DBA should run SELECT pgbaton.grant_roles()', SQLERRM;
    END;
END $$;

SELECT pgbaton.grant_roles();

UPDATE pgbaton.schema_version SET version = 105;
