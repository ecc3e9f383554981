-- queueworker functions: dependencies between tasks (`queueworker.task_dependencies`).
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE: CREATE OR REPLACE TRIGGER cannot
-- replace a constraint trigger). A SQL-language body is checked when it is created: what it calls
-- must come from an earlier file, or from earlier in the same one. PL/pgSQL bodies are resolved
-- when they run.

-- A task enqueued with prerequisites starts `blocked`: unclaimable, counted apart. It becomes
-- `pending` when every prerequisite has succeeded, in the statement that records the last success;
-- it is `cancelled` (error type DependencyFailed, naming the prerequisite) when one ends failed or
-- cancelled, unless its edge says to run anyway; retrying that prerequisite re-blocks what its end
-- cancelled. Cancellation and re-blocking carry on down the graph. Workers never advance
-- downstream work and the orchestration never marks work done: the database moves dependents only
-- from `blocked` (or a cancellation it made itself), as prerequisites finish.
--
-- Who settles a dependent, and why it cannot be missed. A prerequisite's end and a new dependent's
-- enqueue may happen in two transactions at once, each unable to see the other. So both sides take
-- one advisory lock before they look: a statement that finishes tasks takes it shared and then
-- settles the dependents it can see; a transaction that added dependencies takes it exclusively at
-- its commit (a deferred constraint trigger) and then settles them against the prerequisites'
-- states as committed by then. Whichever comes second sees the other's work. The exclusive lock is
-- held only while that transaction commits, so an application's long transaction never holds up a
-- worker. Each settlement locks the dependent rows first and judges them in a new statement, whose
-- snapshot sees what the transactions it waited for committed.

-- The advisory lock both sides of a settlement take (see above); a key of queueworker's own.
CREATE OR REPLACE FUNCTION queueworker.dependency_lock_key()
RETURNS bigint LANGUAGE sql IMMUTABLE AS 'SELECT 1903688709::bigint';

-- Judges the given dependents against their prerequisites' states now, and moves those whose verdict
-- changed: `pending` (every prerequisite succeeded, or ended and may be ignored), `cancelled`
-- (one ended failed or cancelled), or back to `blocked` (a cancellation it made is undone by a
-- retry). Prerequisites in `succeeded` count as succeeded whatever this statement can see (the
-- caller has just recorded them). Returns the dependents whose change concerns their own
-- dependents in turn (into or out of `cancelled`).
CREATE OR REPLACE FUNCTION queueworker.settle_tasks(dependents bigint[], succeeded bigint[]) RETURNS bigint[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    locked bigint[];
    onward bigint[];
BEGIN
    SELECT array_agg(id) INTO locked FROM (
        SELECT t.id FROM queueworker.tasks t
        WHERE t.id = ANY(dependents)
          AND (t.state = 'blocked' OR (t.state = 'cancelled' AND t.error ->> 'type' = 'DependencyFailed'))
        ORDER BY t.id
        FOR UPDATE OF t) AS rows;
    IF locked IS NULL THEN
        RETURN '{}';
    END IF;
    WITH prerequisite AS (
        SELECT d.task_id, d.prerequisite_id, d.cancel_on_failure,
               CASE WHEN d.prerequisite_id = ANY(succeeded) THEN 'succeeded' ELSE p.state END AS state
        FROM queueworker.task_dependencies d
        JOIN queueworker.tasks p ON p.id = d.prerequisite_id
        WHERE d.task_id = ANY(locked)
    ), verdict AS (
        SELECT task_id,
               min(prerequisite_id) FILTER (WHERE state IN ('failed', 'cancelled') AND cancel_on_failure) AS culprit,
               bool_and(state = 'succeeded' OR (state IN ('failed', 'cancelled') AND NOT cancel_on_failure)) AS ready
        FROM prerequisite GROUP BY task_id
    ), judged AS (
        SELECT v.task_id, v.culprit, c.state AS culprit_state, t.state AS old_state,
               coalesce((ct.error ->> 'root')::bigint, v.culprit) AS root,  -- where a cascade of cancels began
               (CASE WHEN v.culprit IS NOT NULL THEN 'cancelled' WHEN v.ready THEN 'pending' ELSE 'blocked' END
               )::queueworker.task_state AS target
        FROM verdict v
        JOIN queueworker.tasks t ON t.id = v.task_id
        LEFT JOIN prerequisite c ON c.task_id = v.task_id AND c.prerequisite_id = v.culprit
        LEFT JOIN queueworker.tasks ct ON ct.id = v.culprit AND ct.error ->> 'type' = 'DependencyFailed'
    ), changed AS (
        UPDATE queueworker.tasks t
        SET state = j.target,
            error = CASE WHEN j.target = 'cancelled' THEN jsonb_build_object(
                        'type', 'DependencyFailed', 'prerequisite', j.culprit, 'root', j.root, 'retryable', false,
                        'message', format('prerequisite task %s ended %s', j.culprit, j.culprit_state)
                                   || CASE WHEN j.root <> j.culprit THEN format(' (after task %s ended)', j.root) ELSE '' END
                    ) END,
            finished_at = CASE WHEN j.target = 'cancelled' THEN now() END,
            delayed = CASE WHEN j.target = 'pending' THEN t.run_after > now() ELSE t.delayed END,
            updated_at = now()
        FROM judged j
        WHERE t.id = j.task_id AND t.state <> j.target
        RETURNING t.id, t.queue, t.state, t.run_after, t.delayed
    ), woken AS (
        SELECT queueworker.wake_queue(queue, min(run_after)) FROM changed WHERE state = 'pending' GROUP BY queue
    )
    SELECT array_agg(c.id) FILTER (WHERE c.state = 'cancelled' OR j.old_state = 'cancelled')
    INTO onward
    FROM changed c JOIN judged j ON j.task_id = c.id, (SELECT count(*) FROM woken) AS w;
    RETURN coalesce(onward, '{}');
END
$$;

-- Settles `dependents` and, as far as their changes reach, the dependents of theirs. Marks the
-- transaction as settling meanwhile, so the update trigger's own call (audit_task_updates,
-- 10_audit.sql) does not repeat it.
CREATE OR REPLACE FUNCTION queueworker.settle_cascade(dependents bigint[], succeeded bigint[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    onward bigint[];
    outer_setting text := coalesce(current_setting('queueworker.settling', true), '');
BEGIN
    PERFORM set_config('queueworker.settling', 'on', true);
    WHILE coalesce(cardinality(dependents), 0) > 0 LOOP
        onward := queueworker.settle_tasks(dependents, succeeded);
        SELECT array_agg(DISTINCT d.task_id) INTO dependents
        FROM queueworker.task_dependencies d WHERE d.prerequisite_id = ANY(onward);
    END LOOP;
    PERFORM set_config('queueworker.settling', outer_setting, true);
END
$$;

-- The finishing side: called by every statement that ends tasks (or undoes an end), with the tasks
-- it changed; `succeeded` lists those it has just recorded as succeeded. Cheap when nothing
-- depends on them: one shared advisory lock and one index probe.
CREATE OR REPLACE FUNCTION queueworker.settle_dependents(prerequisites bigint[], succeeded bigint[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    dependents bigint[];
BEGIN
    IF coalesce(cardinality(prerequisites), 0) = 0 THEN
        RETURN;
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(queueworker.dependency_lock_key());
    SELECT array_agg(DISTINCT d.task_id) INTO dependents
    FROM queueworker.task_dependencies d WHERE d.prerequisite_id = ANY(prerequisites);
    IF dependents IS NOT NULL THEN
        PERFORM queueworker.settle_cascade(dependents, coalesce(succeeded, '{}'));
    END IF;
END
$$;

-- The enqueueing side: at the commit of a transaction that added dependencies.
CREATE OR REPLACE FUNCTION queueworker.settle_new_dependency() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(queueworker.dependency_lock_key());
    PERFORM queueworker.settle_cascade(ARRAY[NEW.task_id], '{}');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS task_dependencies_settle ON queueworker.task_dependencies;
CREATE CONSTRAINT TRIGGER task_dependencies_settle AFTER INSERT ON queueworker.task_dependencies
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION queueworker.settle_new_dependency();

REVOKE EXECUTE ON FUNCTION queueworker.settle_dependents(bigint[], bigint[]) FROM PUBLIC;
