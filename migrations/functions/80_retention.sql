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
-- advisory lock (transaction-scoped) lets one worker at a time do it. A definer function: the worker
-- role may EXECUTE it and holds no DELETE on the history itself. Called by `clean_finished` (worker/db/duties.sql).
CREATE OR REPLACE FUNCTION queueworker.clean_finished(lock_key bigint, retention_seconds float8, batch integer)
RETURNS SETOF bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH guard AS MATERIALIZED (
        SELECT pg_catalog.pg_try_advisory_xact_lock(lock_key) AS held
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

-- Functions are executable by PUBLIC unless revoked; this one deletes history.
REVOKE EXECUTE ON FUNCTION queueworker.clean_finished(bigint, float8, integer) FROM PUBLIC;
