-- queueworker schema, version 3: the audit trail holds against the roles that use the queue.
--
-- With least-privilege roles (docs/database-roles.sql, docs/security.md) a producer may insert
-- tasks but must not write, change or delete audit rows. So:
-- * the audit triggers run as the schema owner (SECURITY DEFINER): an enqueue or an operator's
--   cancel still writes its audit row, while the role doing it holds no privilege on
--   `task_events`. A definer function must not resolve names through the caller's search_path,
--   hence `SET search_path = pg_catalog, pg_temp` and schema-qualified names throughout;
-- * `task_events` refuses TRUNCATE as it refuses UPDATE (the owner or a superuser can still
--   disable triggers: no trigger binds them);
-- * retention is the one way audit rows are deleted: `queueworker.clean_finished`, a definer
--   function that deletes only finished tasks past the retention together with their audit
--   rows. The worker role may EXECUTE it and holds no DELETE on the history itself.
-- `CLAIM` and `COMPLETE_SUCCEEDED` (worker/sql.py) still insert their audit rows directly, aimed
-- at the `tasks_active` partition for speed, so the worker role keeps INSERT on `task_events`.

CREATE OR REPLACE FUNCTION queueworker.audit_task_inserts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT n.id, NULL, n.state, n.lease_owner, n.lease_token, NULL
    FROM new_rows n;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION queueworker.audit_task_updates() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT n.id, o.state, n.state, coalesce(o.lease_owner, n.lease_owner), n.lease_token,
           queueworker.transition_detail(n.attempts, n.error, o.error)
    FROM new_rows n
    JOIN old_rows o ON o.id = n.id
    WHERE n.state IS DISTINCT FROM o.state;
    RETURN NULL;
END
$$;

CREATE TRIGGER task_events_no_truncate BEFORE TRUNCATE ON queueworker.task_events
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.forbid_event_updates();

-- Deletes finished tasks older than the retention, oldest first, at most `batch` of them, with
-- their audit rows; returns their ids. The advisory lock (transaction-scoped) lets one worker at
-- a time do it. Called by sql.CLEAN_FINISHED.
CREATE FUNCTION queueworker.clean_finished(lock_key bigint, retention_seconds float8, batch integer)
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
    )
    DELETE FROM queueworker.tasks t USING old
    WHERE t.id = old.id AND t.state IN ('succeeded', 'failed', 'cancelled')
    RETURNING t.id
$$;

-- Functions are executable by PUBLIC unless revoked; this one deletes history.
REVOKE EXECUTE ON FUNCTION queueworker.clean_finished(bigint, float8, integer) FROM PUBLIC;
