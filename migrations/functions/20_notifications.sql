-- queueworker functions: notifications (channels `queueworker` and `queueworker_finished`).
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE: CREATE OR REPLACE TRIGGER cannot
-- replace a constraint trigger). A SQL-language body is checked when it is created: what it calls
-- must come from an earlier file, or from earlier in the same one. PL/pgSQL bodies are resolved
-- when they run.

-- Wakes a queue's listeners for the rows of one group (as `enqueue` in worker/db/enqueue.sql does): at once when one is due
-- now, else with the earliest due time, so listeners can schedule a precise wake-up.
-- PL/pgSQL, as every function with a SET clause that an enqueue calls: Postgres 15 plans a SQL-language
-- one again at every call (tests/test_nested_plans.py).
CREATE OR REPLACE FUNCTION queueworker.wake_queue(queue text, earliest timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_catalog.pg_notify('queueworker', CASE WHEN earliest <= now() THEN queue
                                                     ELSE queue || ' ' || extract(epoch FROM earliest)::text END);
END
$$;

-- A task enqueued with `notify_on_finish` sends `pg_notify('queueworker_finished', id)` when it
-- ends succeeded, failed or cancelled, so `queueworker.wait_for` wakes at once instead of polling.
-- Only such tasks pay for it: the success statements notify from their own rows, and every other
-- way a task ends (a failure, a rescue, a cancel, a cascade) goes through this statement trigger.
CREATE OR REPLACE FUNCTION queueworker.notify_finished() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    nestloop text := pg_catalog.current_setting('enable_nestloop');
BEGIN
    -- Without nested loops: audit_task_updates (10_audit.sql) says why.
    PERFORM pg_catalog.set_config('enable_nestloop', 'off', true);
    PERFORM pg_catalog.pg_notify('queueworker_finished', n.id::text)
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.notify_on_finish AND n.state IN ('succeeded', 'failed', 'cancelled')
      AND n.state IS DISTINCT FROM o.state;
    PERFORM pg_catalog.set_config('enable_nestloop', nestloop, true);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS tasks_notify_finished ON queueworker.tasks;
CREATE TRIGGER tasks_notify_finished AFTER UPDATE ON queueworker.tasks
    REFERENCING NEW TABLE AS new_rows OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.notify_finished();

-- Marks tasks just enqueued with `notify_on_finish` (the producer's NOTIFY_ON_FINISH, worker/db/enqueue.sql);
-- returns the ids marked. A definer function, so the producer needs no UPDATE on tasks (which would also
-- let it lock any task row with SELECT ... FOR UPDATE), and only for tasks of queues it may use (another's
-- is to it a task that does not exist, and is left alone).
CREATE OR REPLACE FUNCTION queueworker.mark_notify_on_finish(ids bigint[]) RETURNS SETOF bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    UPDATE queueworker.tasks SET notify_on_finish = true
    WHERE id = ANY(ids) AND NOT notify_on_finish AND queue LIKE ANY ((SELECT queueworker.queue_patterns())::text[])
    RETURNING id
$$;

REVOKE EXECUTE ON FUNCTION queueworker.notify_finished(), queueworker.mark_notify_on_finish(bigint[]) FROM PUBLIC;
