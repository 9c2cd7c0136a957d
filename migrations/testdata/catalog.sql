-- catalog.sql describes every object in the schema pgbaton as sorted lines
-- of text, from the system catalogs alone (no pg_dump, so any server major
-- the tests start can run it): TestCatalogSnapshot compares its output with
-- catalog.golden, so every change to the schema shows in review. The one
-- golden holds for every major `make test-matrix` runs (13 to 18): what a
-- newer server adds to the catalogs for the same schema is left out below
-- (NOT NULL constraints of 18, the MAINTAIN privilege of 17).
WITH ns AS (SELECT 'pgbaton'::regnamespace AS oid),
rels AS (
    SELECT c.* FROM pg_catalog.pg_class c, ns
     WHERE c.relnamespace = ns.oid AND c.relname <> 'schema_migrations'
       AND NOT (c.relkind = 'i' AND c.relname LIKE 'schema_migrations%')
),
acl(obj, items) AS (
    SELECT 'schema pgbaton', (SELECT nspacl FROM pg_catalog.pg_namespace WHERE oid = (SELECT oid FROM ns))
    UNION ALL SELECT 'relation ' || relname, relacl FROM rels
    UNION ALL SELECT 'function ' || p.oid::regprocedure, p.proacl FROM pg_catalog.pg_proc p, ns WHERE p.pronamespace = ns.oid
    UNION ALL SELECT 'column ' || c.relname || '.' || a.attname, a.attacl
        FROM rels c JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid
       WHERE a.attnum > 0 AND NOT a.attisdropped AND a.attacl IS NOT NULL
)
SELECT line FROM (
    SELECT 'schema pgbaton comment ' || coalesce(obj_description((SELECT oid FROM ns), 'pg_namespace'), '-')
    UNION ALL
    SELECT 'role ' || rolname || ' login=' || rolcanlogin || ' inherit=' || rolinherit
      FROM pg_catalog.pg_roles WHERE rolname IN ('pgbaton_reader', 'pgbaton_admin')
    UNION ALL
    SELECT 'role ' || r.rolname || ' member of ' || g.rolname
      FROM pg_catalog.pg_auth_members m
      JOIN pg_catalog.pg_roles r ON r.oid = m.member
      JOIN pg_catalog.pg_roles g ON g.oid = m.roleid
     WHERE r.rolname IN ('pgbaton_reader', 'pgbaton_admin') OR g.rolname IN ('pgbaton_reader', 'pgbaton_admin')
    UNION ALL
    -- Relations: kind, persistence, storage options, row security.
    SELECT 'relation ' || relname || ' kind=' || relkind::text || ' persistence=' || relpersistence::text::text
           || ' options=' || coalesce(array_to_string(reloptions, ','), '-')
           || ' rls=' || relrowsecurity
           || ' comment=' || coalesce(obj_description(oid, 'pg_class'), '-')
      FROM rels
    UNION ALL
    -- Columns in their order (attnum of dropped columns left out).
    SELECT 'column ' || c.relname || ' #' || lpad(row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum)::text, 2, '0')
           || ' ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
           || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
           || CASE WHEN a.attidentity::text <> '' THEN ' identity=' || a.attidentity::text ELSE '' END
           || CASE WHEN a.attgenerated::text <> '' THEN ' generated' ELSE '' END
           || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
           || coalesce(' collation ' || nullif(a.attcollation, t.typcollation)::regcollation::text, '')
           || coalesce(' comment ' || col_description(c.oid, a.attnum), '')
      FROM rels c
      JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
      LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
     WHERE c.relkind IN ('r', 'v', 'm', 'p', 'f')
    UNION ALL
    SELECT 'constraint ' || c.relname || '.' || k.conname || ' ' || pg_get_constraintdef(k.oid)
           || CASE WHEN k.condeferrable THEN ' deferrable' ELSE '' END
      FROM rels c JOIN pg_catalog.pg_constraint k ON k.conrelid = c.oid
     -- NOT NULL is on the column's line; PostgreSQL 18 and later also
     -- list it here, as a constraint of its own.
     WHERE k.contype <> 'n'
    UNION ALL
    SELECT 'index ' || pg_get_indexdef(i.indexrelid)
           || coalesce(' options=' || array_to_string(x.reloptions, ','), '')
      FROM rels c JOIN pg_catalog.pg_index i ON i.indrelid = c.oid
      JOIN pg_catalog.pg_class x ON x.oid = i.indexrelid
    UNION ALL
    SELECT 'trigger ' || pg_get_triggerdef(g.oid)
      FROM rels c JOIN pg_catalog.pg_trigger g ON g.tgrelid = c.oid AND NOT g.tgisinternal
    UNION ALL
    SELECT 'view ' || c.relname || E'\n' || pg_get_viewdef(c.oid)
      FROM rels c WHERE c.relkind IN ('v', 'm')
    UNION ALL
    SELECT 'sequence ' || c.relname || ' ' || format_type(s.seqtypid, NULL)
           || ' start=' || s.seqstart || ' increment=' || s.seqincrement
           || ' min=' || s.seqmin || ' max=' || s.seqmax || ' cache=' || s.seqcache || ' cycle=' || s.seqcycle
           || coalesce(' owned by ' || (SELECT t.relname || '.' || a.attname
                 FROM pg_catalog.pg_depend dep
                 JOIN pg_catalog.pg_class t ON t.oid = dep.refobjid
                 JOIN pg_catalog.pg_attribute a ON a.attrelid = dep.refobjid AND a.attnum = dep.refobjsubid
                WHERE dep.classid = 'pg_class'::regclass AND dep.objid = c.oid AND dep.deptype::text IN ('a', 'i')), '')
      FROM rels c JOIN pg_catalog.pg_sequence s ON s.seqrelid = c.oid
    UNION ALL
    SELECT 'type ' || t.typname || ' kind=' || t.typtype::text
      FROM pg_catalog.pg_type t, ns
     WHERE t.typnamespace = ns.oid AND t.typtype IN ('c', 'd', 'e', 'r', 'm')
       AND NOT EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid = t.typrelid AND c.relkind <> 'c')
    UNION ALL
    -- Functions whole: arguments, result, language, volatility, SET
    -- clauses, security and the body, as the server prints them.
    SELECT 'function ' || p.oid::regprocedure
           || ' comment=' || coalesce(obj_description(p.oid, 'pg_proc'), '-') || E'\n'
           || pg_get_functiondef(p.oid)
      FROM pg_catalog.pg_proc p, ns WHERE p.pronamespace = ns.oid
    UNION ALL
    -- MAINTAIN (m), PostgreSQL 17 and later, is in every owner's
    -- privileges there; pgbaton grants it to nobody, so it is left out.
    SELECT 'grant ' || obj || ' ' || coalesce((SELECT string_agg(regexp_replace(i::text, '=([^/]*)m', '=\1'), ',' ORDER BY i::text)
                                                FROM unnest(items) i), 'default')
      FROM acl
    UNION ALL
    -- Rows the schema itself inserts.
    SELECT 'row token_epoch ' || count(*) FROM pgbaton.token_epoch
) lines(line)
ORDER BY line COLLATE "C";
