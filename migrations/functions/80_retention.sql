-- queueworker functions: retention of finished tasks.
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE: CREATE OR REPLACE TRIGGER cannot
-- replace a constraint trigger). A SQL-language body is checked when it is created: what it calls
-- must come from an earlier file, or from earlier in the same one. PL/pgSQL bodies are resolved
-- when they run.

-- Retention is the one way audit rows are deleted. Deletes finished tasks older than the retention,
-- oldest first, at most `batch` of them, with their audit rows and their edges; returns their ids.
-- A finished prerequisite has already had its say: its dependents were settled when it ended. The
-- row 'clean_finished' of queueworker.duty_locks (migration 013), locked for the transaction, lets
-- one worker at a time do it; a login without the grants cannot lock it (an advisory key could be
-- held by anyone). A definer function: the worker role may EXECUTE it and holds no DELETE on the
-- history itself. Called by `clean_finished` (worker/db/duties.sql).
CREATE OR REPLACE FUNCTION queueworker.clean_finished(retention_seconds float8, batch integer)
RETURNS SETOF bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH guard AS MATERIALIZED (
        SELECT count(*) > 0 AS held FROM (
            SELECT FROM queueworker.duty_locks WHERE duty = 'clean_finished' FOR NO KEY UPDATE SKIP LOCKED) AS duty
    ), old AS (
        SELECT t.id FROM queueworker.tasks t, guard
        WHERE guard.held AND t.finished_at < now() - make_interval(secs => retention_seconds)
          AND t.state IN ('succeeded', 'failed', 'cancelled')
        ORDER BY t.finished_at
        LIMIT batch
        FOR UPDATE OF t SKIP LOCKED
    ), events AS (
        DELETE FROM queueworker.task_events e USING old WHERE e.task_id = old.id
    ), edges AS (
        DELETE FROM queueworker.task_dependencies d USING old WHERE d.task_id = old.id OR d.prerequisite_id = old.id
    )
    DELETE FROM queueworker.tasks t USING old
    WHERE t.id = old.id AND t.state IN ('succeeded', 'failed', 'cancelled')
    RETURNING t.id
$$;

-- Version 12's signature, which its workers call during a rolling upgrade: the key they pass is
-- no longer a lock of any kind.
CREATE OR REPLACE FUNCTION queueworker.clean_finished(lock_key bigint, retention_seconds float8, batch integer)
RETURNS SETOF bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT queueworker.clean_finished(retention_seconds, batch)
$$;

-- Functions are executable by PUBLIC unless revoked; these delete history.
REVOKE EXECUTE ON FUNCTION queueworker.clean_finished(float8, integer),
                           queueworker.clean_finished(bigint, float8, integer) FROM PUBLIC;
