-- queueworker functions: queue grants (`queueworker.queue_grants`, migration 016).
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE: CREATE OR REPLACE TRIGGER cannot
-- replace a constraint trigger). A SQL-language body is checked when it is created: what it calls
-- must come from an earlier file, or from earlier in the same one. PL/pgSQL bodies are resolved
-- when they run.
--
-- The acting login is `session_user`: inside a definer function `current_user` is the owner, and a
-- login can only SET ROLE to roles it is a member of anyway. Grants bind every login except those
-- that run queueworker itself: superusers, members of the schema's owner (the migrator), and members
-- of queueworker_worker, queueworker_controller and queueworker_operator (roles that do not exist
-- are skipped). Those are trusted with every queue; producers are the tenants.

-- A glob as a LIKE pattern (escape character `\`): `*` any run of characters, `?` one; the LIKE
-- wildcards a queue name may hold (`_`) match only themselves.
CREATE OR REPLACE FUNCTION queueworker.glob_like(pattern text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(
               pattern, '\', '\\'), '%', '\%'), '_', '\_'), '*', '%'), '?', '_')
$$;

-- Whether the acting login is free of queue grants (see above).
-- This and queue_patterns run in every enqueue (the insert's audit trigger, the producer's row-level
-- security), so they are PL/pgSQL: a SQL-language function with a SET clause is never inlined, and
-- Postgres 15 plans its body again at every call (0.13 ms, three times per enqueue statement), while
-- PL/pgSQL keeps its plans for the session.
CREATE OR REPLACE FUNCTION queueworker.unbound_by_grants() RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN NOT EXISTS (SELECT FROM queueworker.queue_grants)
        OR EXISTS (SELECT FROM pg_roles r
                   WHERE (r.oid = (SELECT nspowner FROM pg_namespace WHERE nspname = 'queueworker')
                          OR r.rolname IN ('queueworker_worker', 'queueworker_controller', 'queueworker_operator'))
                     AND pg_has_role(session_user, r.oid, 'MEMBER'));
END
$$;

-- The LIKE patterns of the queues the acting login may use: `{%}` (every queue) for a login free of
-- grants, else those of the grants to the roles it is a member of (none: no queue at all). The
-- producer's row-level security (docs/database-roles.sql) calls it once per statement, as a scalar
-- subquery, so a bulk insert pays one LIKE per row.
CREATE OR REPLACE FUNCTION queueworker.queue_patterns() RETURNS text[]
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF queueworker.unbound_by_grants() THEN
        RETURN ARRAY['%'];
    END IF;
    RETURN ARRAY(SELECT queueworker.glob_like(g.pattern)
                 FROM queueworker.queue_grants g JOIN pg_roles r ON r.rolname = g.grantee
                 WHERE pg_has_role(session_user, r.oid, 'MEMBER')
                 ORDER BY g.pattern);
END
$$;

-- Refuses, in one line that names the login and the queue, unless the acting login may use every
-- queue given. The definer functions a producer calls check their arguments with it.
CREATE OR REPLACE FUNCTION queueworker.require_queues(queues text[]) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    patterns text[] := queueworker.queue_patterns();
    refused text;
BEGIN
    IF patterns = ARRAY['%'] THEN
        RETURN;
    END IF;
    SELECT q INTO refused FROM unnest(queues) AS q WHERE q IS NULL OR NOT q LIKE ANY (patterns) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'login % may not use queue %', session_user, coalesce(refused, '(none)')
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'queue grants decide which queues a producer may use: `queueworker grants` lists them';
    END IF;
END
$$;

-- `queueworker grant ROLE --queue PATTERN`: gives ROLE (and its members) the queues PATTERN matches;
-- returns whether the grant is new. The role must exist; the pattern must be a glob over queue names.
CREATE OR REPLACE FUNCTION queueworker.grant_queue(grantee text, pattern text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF grantee IS NULL OR NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = grantee) THEN
        RAISE EXCEPTION 'there is no role %', coalesce(quote_ident(grantee), '(none)')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pattern IS NULL OR pattern !~ '^[A-Za-z0-9_.:*?-]{1,128}$' THEN
        RAISE EXCEPTION 'a queue pattern is 1 to 128 of letters, digits, _.:- and the wildcards * and ?, not %',
                        coalesce(quote_literal(left(pattern, 140)), '(none)')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO queueworker.queue_grants (grantee, pattern) VALUES (grantee, pattern)
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;

-- `queueworker revoke ROLE --queue PATTERN`: removes exactly that grant; returns whether there was one.
CREATE OR REPLACE FUNCTION queueworker.revoke_queue(grantee text, pattern text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH revoked AS (
        DELETE FROM queueworker.queue_grants g WHERE g.grantee = revoke_queue.grantee AND g.pattern = revoke_queue.pattern
        RETURNING 1
    )
    SELECT count(*) > 0 FROM revoked
$$;

REVOKE EXECUTE ON FUNCTION queueworker.unbound_by_grants(), queueworker.queue_patterns(),
                           queueworker.require_queues(text[]), queueworker.grant_queue(text, text),
                           queueworker.revoke_queue(text, text)
FROM PUBLIC;
