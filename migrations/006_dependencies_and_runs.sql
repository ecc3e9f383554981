-- queueworker schema, version 6: dependencies between tasks (staged pipelines) and partitioned runs.
--
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
--
-- Partitioned runs (seed 003):
--
-- A run fans out `expected` partition tasks and counts their terminal outcomes (fan-in) in the
-- statements that record them: a completion, a failure, a rescue that fails a task, a cancel, a
-- retry that takes an outcome back. The run's row lock serialises concurrent counts, so they are
-- exact however outcomes are batched. When every partition has succeeded, the run's `on_success`
-- task (the consolidation) is enqueued once, by the statement that counted the last success; when
-- a partition ends failed or cancelled, the run fails and its `on_failure` task (the alert) is
-- enqueued once, and no consolidation happens unless the run is finalised with force. The run
-- succeeds, and its watermark advances (to the run's start: everything before it was covered),
-- only when the consolidation succeeds, or, without one, when the last partition does.

-- Blocked tasks are unfinished work: they live in `tasks_active` (and hold dedupe keys there). A
-- table with a transition-table trigger cannot be attached as a partition: that trigger (the audit
-- of inserts aimed at the partition, migration 004) steps aside meanwhile.
DROP TRIGGER tasks_active_audit_insert ON queueworker.tasks_active;
ALTER TABLE queueworker.tasks DETACH PARTITION queueworker.tasks_active;
ALTER TABLE queueworker.tasks_active ADD CONSTRAINT tasks_active_states
    CHECK (state IN ('pending', 'running', 'retrying', 'blocked'));  -- lets ATTACH skip its scan
ALTER TABLE queueworker.tasks ATTACH PARTITION queueworker.tasks_active
    FOR VALUES IN ('pending', 'running', 'retrying', 'blocked');
ALTER TABLE queueworker.tasks_active DROP CONSTRAINT tasks_active_states;
CREATE TRIGGER tasks_active_audit_insert AFTER INSERT ON queueworker.tasks_active
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.audit_task_inserts();

-- One row per edge. A dependent is always enqueued after its prerequisites exist, so it has the
-- larger id: the CHECK makes a cycle impossible.
CREATE TABLE queueworker.task_dependencies (
    prerequisite_id   bigint NOT NULL,
    task_id           bigint NOT NULL,
    cancel_on_failure boolean NOT NULL,   -- TaskSpec.on_dependency_failure = "cancel"
    PRIMARY KEY (prerequisite_id, task_id),
    CONSTRAINT prerequisite_first CHECK (prerequisite_id < task_id)
);
CREATE INDEX task_dependencies_task ON queueworker.task_dependencies (task_id);

-- Blocked tasks by queue, for the controller's depth read (sql.QUEUE_DEPTH).
CREATE INDEX tasks_blocked ON queueworker.tasks_active (queue) WHERE state = 'blocked';

-- The advisory lock both sides of a settlement take (see above); a key of queueworker's own.
CREATE FUNCTION queueworker.dependency_lock_key() RETURNS bigint LANGUAGE sql IMMUTABLE AS 'SELECT 1903688709::bigint';

-- Judges the given dependents against their prerequisites' states now, and moves those whose verdict
-- changed: `pending` (every prerequisite succeeded, or ended and may be ignored), `cancelled`
-- (one ended failed or cancelled), or back to `blocked` (a cancellation it made is undone by a
-- retry). Prerequisites in `succeeded` count as succeeded whatever this statement can see (the
-- caller has just recorded them). Returns the dependents whose change concerns their own
-- dependents in turn (into or out of `cancelled`).
CREATE FUNCTION queueworker.settle_tasks(dependents bigint[], succeeded bigint[]) RETURNS bigint[]
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
-- transaction as settling meanwhile, so the update trigger's own call (below) does not repeat it.
CREATE FUNCTION queueworker.settle_cascade(dependents bigint[], succeeded bigint[]) RETURNS void
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
CREATE FUNCTION queueworker.settle_dependents(prerequisites bigint[], succeeded bigint[]) RETURNS void
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
CREATE FUNCTION queueworker.settle_new_dependency() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(queueworker.dependency_lock_key());
    PERFORM queueworker.settle_cascade(ARRAY[NEW.task_id], '{}');
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER task_dependencies_settle AFTER INSERT ON queueworker.task_dependencies
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION queueworker.settle_new_dependency();


CREATE TYPE queueworker.run_state AS ENUM ('running', 'succeeded', 'failed');

CREATE TABLE queueworker.runs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name             text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    state            queueworker.run_state NOT NULL DEFAULT 'running',
    expected         integer NOT NULL CHECK (expected >= 1),
    succeeded        integer NOT NULL DEFAULT 0 CHECK (succeeded >= 0),
    failed           integer NOT NULL DEFAULT 0 CHECK (failed >= 0),
    cancelled        integer NOT NULL DEFAULT 0 CHECK (cancelled >= 0),
    on_success       jsonb,      -- {task, queue, payload, priority, max_attempts, timeout_seconds}
    on_failure       jsonb,
    success_task_id  bigint,     -- the consolidation, once enqueued
    failure_task_id  bigint,     -- the alert, once enqueued
    forced           boolean NOT NULL DEFAULT false,
    watermark        text,       -- the name of the watermark this run advances
    watermark_before jsonb,
    watermark_after  jsonb,
    started_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    CONSTRAINT outcomes_bounded CHECK (succeeded + failed + cancelled <= expected)
);
CREATE INDEX runs_name ON queueworker.runs (name, id DESC);

CREATE TABLE queueworker.watermarks (
    name       text PRIMARY KEY,
    value      jsonb NOT NULL,
    run_id     bigint,
    updated_at timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE queueworker.tasks ADD COLUMN run_id bigint, ADD COLUMN run_partition integer;
CREATE INDEX tasks_run ON queueworker.tasks (run_id, run_partition) WHERE run_id IS NOT NULL;

-- Enqueues a run's consolidation or alert from its stored spec; returns the task's id.
CREATE FUNCTION queueworker.enqueue_run_task(run_id bigint, spec jsonb) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    new_id bigint;
BEGIN
    INSERT INTO queueworker.tasks (queue, task, payload, priority, max_attempts, timeout_seconds, delayed, run_id)
    VALUES (coalesce(spec ->> 'queue', 'default'), spec ->> 'task', coalesce(spec -> 'payload', '{}'),
            coalesce((spec ->> 'priority')::integer, 0), coalesce((spec ->> 'max_attempts')::integer, 10),
            (spec ->> 'timeout_seconds')::integer, false, run_id)
    RETURNING id INTO new_id;
    PERFORM queueworker.wake_queue(coalesce(spec ->> 'queue', 'default'), now());
    RETURN new_id;
END
$$;

-- Moves a (locked) run on from its counters: consolidation or success when every partition
-- succeeded, failure (and the alert) when one ended failed or cancelled, back to running when a
-- retry took the last failure back.
CREATE FUNCTION queueworker.advance_run(run_id bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r queueworker.runs;
BEGIN
    SELECT * INTO r FROM queueworker.runs WHERE id = run_id FOR UPDATE;
    IF r.state = 'failed' AND r.failed + r.cancelled = 0 AND r.success_task_id IS NULL THEN
        UPDATE queueworker.runs SET state = 'running', finished_at = NULL WHERE id = r.id RETURNING * INTO r;
    END IF;
    IF r.state <> 'running' THEN
        RETURN;
    END IF;
    IF r.failed + r.cancelled > 0 AND NOT r.forced THEN
        UPDATE queueworker.runs SET state = 'failed', finished_at = now() WHERE id = r.id;
        IF r.on_failure IS NOT NULL AND r.failure_task_id IS NULL THEN
            UPDATE queueworker.runs SET failure_task_id = queueworker.enqueue_run_task(r.id, r.on_failure)
            WHERE id = r.id;
        END IF;
    ELSIF (r.succeeded = r.expected OR r.forced AND r.succeeded + r.failed + r.cancelled = r.expected)
          AND r.success_task_id IS NULL THEN
        IF r.on_success IS NOT NULL THEN
            UPDATE queueworker.runs SET success_task_id = queueworker.enqueue_run_task(r.id, r.on_success)
            WHERE id = r.id;
        ELSE
            PERFORM queueworker.finish_run(r.id, true);
        END IF;
    END IF;
END
$$;

-- The run's end: succeeded (its watermark advances to the run's start) or failed (untouched).
CREATE FUNCTION queueworker.finish_run(run_id bigint, success boolean) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r queueworker.runs;
BEGIN
    UPDATE queueworker.runs
    SET state = CASE WHEN success THEN 'succeeded' ELSE 'failed' END::queueworker.run_state, finished_at = now(),
        watermark_after = CASE WHEN success AND watermark IS NOT NULL THEN to_jsonb(started_at) END
    WHERE id = run_id RETURNING * INTO r;
    IF success AND r.watermark IS NOT NULL THEN
        INSERT INTO queueworker.watermarks (name, value, run_id) VALUES (r.watermark, r.watermark_after, r.id)
        ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, run_id = EXCLUDED.run_id, updated_at = now();
    END IF;
END
$$;

-- Counts terminal outcomes of tasks that belong to runs: (old state, new state) per task. Runs are
-- locked in id order. Called by COMPLETE_SUCCEEDED (its `counted` step) and by the update trigger.
CREATE FUNCTION queueworker.count_run_outcomes(ids bigint[], run_ids bigint[], partitions integer[],
                                               old_states text[], new_states text[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    d record;
    r queueworker.runs;
BEGIN
    FOR d IN
        SELECT u.run_id,
               coalesce(sum(CASE WHEN u.new_state = 'succeeded' THEN 1 WHEN u.old_state = 'succeeded' THEN -1 END)
                        FILTER (WHERE u.partition IS NOT NULL), 0) AS succeeded,
               coalesce(sum(CASE WHEN u.new_state = 'failed' THEN 1 WHEN u.old_state = 'failed' THEN -1 END)
                        FILTER (WHERE u.partition IS NOT NULL), 0) AS failed,
               coalesce(sum(CASE WHEN u.new_state = 'cancelled' THEN 1 WHEN u.old_state = 'cancelled' THEN -1 END)
                        FILTER (WHERE u.partition IS NOT NULL), 0) AS cancelled,
               array_agg(u.id) FILTER (WHERE u.partition IS NULL) AS own_tasks,
               array_agg(u.new_state) FILTER (WHERE u.partition IS NULL) AS own_states
        FROM unnest(ids, run_ids, partitions, old_states, new_states) AS u(id, run_id, partition, old_state, new_state)
        WHERE u.run_id IS NOT NULL
        GROUP BY u.run_id ORDER BY u.run_id
    LOOP
        UPDATE queueworker.runs
        SET succeeded = succeeded + d.succeeded, failed = failed + d.failed, cancelled = cancelled + d.cancelled
        WHERE id = d.run_id AND (d.succeeded, d.failed, d.cancelled) <> (0, 0, 0);
        -- The run's consolidation (its partition is NULL) decides the run.
        SELECT * INTO r FROM queueworker.runs WHERE id = d.run_id FOR UPDATE;
        IF r.success_task_id = ANY(d.own_tasks) THEN
            IF d.own_states[array_position(d.own_tasks, r.success_task_id)] = 'succeeded' THEN
                PERFORM queueworker.finish_run(r.id, true);
            ELSIF d.own_states[array_position(d.own_tasks, r.success_task_id)] IN ('failed', 'cancelled') THEN
                PERFORM queueworker.finish_run(r.id, false);
            ELSE  -- retried: running again
                UPDATE queueworker.runs SET state = 'running', finished_at = NULL WHERE id = r.id;
            END IF;
        ELSE
            PERFORM queueworker.advance_run(d.run_id);
        END IF;
    END LOOP;
END
$$;

-- Parent-routed transitions (a failure, a rescue, a cancel, a retry, and settlements themselves)
-- settle what depends on the tasks they ended or revived, and count for the runs these belong to.
CREATE OR REPLACE FUNCTION queueworker.audit_task_updates() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    moved bigint[];
BEGIN
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT n.id, o.state, n.state, coalesce(o.lease_owner, n.lease_owner), n.lease_token,
           CASE WHEN n.state IS DISTINCT FROM o.state
                THEN queueworker.transition_detail(n.attempts, n.error, o.error)
                ELSE jsonb_build_object('replaced', queueworker.replaced_columns(n, o)) END
    FROM new_rows n
    JOIN old_rows o ON o.id = n.id
    WHERE n.state IS DISTINCT FROM o.state
       OR (n.state = 'pending' AND queueworker.replaced_columns(n, o) IS NOT NULL);
    PERFORM queueworker.count_run_outcomes(array_agg(n.id), array_agg(n.run_id), array_agg(n.run_partition),
                                           array_agg(o.state::text), array_agg(n.state::text))
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.run_id IS NOT NULL AND n.state IS DISTINCT FROM o.state
    HAVING count(*) > 0;
    IF coalesce(current_setting('queueworker.settling', true), '') <> 'on' THEN
        SELECT array_agg(n.id) INTO moved
        FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE n.state IS DISTINCT FROM o.state
          AND (n.state IN ('succeeded', 'failed', 'cancelled') OR o.state IN ('failed', 'cancelled'));
        PERFORM queueworker.settle_dependents(moved, '{}');
    END IF;
    RETURN NULL;
END
$$;

-- Starts a run: its row, with the watermark as it stands. Its partitions are enqueued by the caller
-- (sql.ENQUEUE_TASKS with the run's id), in the same transaction.
CREATE FUNCTION queueworker.start_run(name text, expected integer, on_success jsonb, on_failure jsonb,
                                      watermark text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO queueworker.runs (name, expected, on_success, on_failure, watermark, watermark_before)
    VALUES (name, expected, on_success, on_failure, watermark,
            (SELECT w.value FROM queueworker.watermarks w WHERE w.name = start_run.watermark))
    RETURNING id
$$;

-- The producer's enqueue for everything beyond a plain task: dedupe keys (as enqueue_unique did)
-- and prerequisites (`prerequisite_ords[i]` is the 1-based position of the spec that depends on
-- task `prerequisite_ids[i]`, which must exist), and for a run's partitions the run and partition
-- number. A spec with prerequisites starts `blocked`; its edges are kept only if it was inserted (a
-- duplicate's holder has its own). Rows are inserted with ids taken in spec order, so each spec
-- finds its row. Called by sql.ENQUEUE_TASKS.
DROP FUNCTION queueworker.enqueue_unique(text[], text[], jsonb[], integer[], timestamptz[], integer[], integer[],
                                         text[], boolean[]);
CREATE FUNCTION queueworker.enqueue_tasks(queues text[], tasks text[], payloads jsonb[], priorities integer[],
                                          run_afters timestamptz[], max_attempts integer[], timeouts integer[],
                                          dedupe_keys text[], by_spec boolean[], cancel_on_failure boolean[],
                                          prerequisite_ords bigint[], prerequisite_ids bigint[],
                                          run_ids bigint[], run_partitions integer[])
RETURNS TABLE (ord bigint, queue text, dedupe_key text, id bigint, notified bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    unknown bigint;
BEGIN
    SELECT p INTO unknown FROM unnest(prerequisite_ids) AS p
    WHERE NOT EXISTS (SELECT 1 FROM queueworker.tasks t WHERE t.id = p) LIMIT 1;
    IF unknown IS NOT NULL THEN
        RAISE EXCEPTION 'there is no task % to depend on', unknown USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN QUERY
    WITH specs AS MATERIALIZED (
        SELECT s.ord, s.queue, s.task, s.payload, s.priority, s.run_after, s.max_attempts, s.timeout_seconds,
               s.cancel_on_failure, s.run_id, s.run_partition, nextval('queueworker.tasks_id_seq') AS new_id,
               CASE WHEN s.by_spec THEN encode(queueworker.spec_hash(s.queue, s.task, s.payload), 'hex')
                    ELSE s.dedupe_key END AS dedupe_key,
               s.ord = ANY(prerequisite_ords) AS blocked
        FROM unnest(queues, tasks, payloads, priorities, run_afters, max_attempts, timeouts, dedupe_keys, by_spec,
                    cancel_on_failure, run_ids, run_partitions)
             WITH ORDINALITY AS s(queue, task, payload, priority, run_after, max_attempts, timeout_seconds,
                                  dedupe_key, by_spec, cancel_on_failure, run_id, run_partition, ord)
        ORDER BY s.ord
    ), inserted AS (
        INSERT INTO queueworker.tasks_active AS t
            (id, queue, task, state, payload, priority, run_after, delayed, max_attempts, timeout_seconds, dedupe_key,
             run_id, run_partition)
        OVERRIDING SYSTEM VALUE  -- the identity is the parent's: an insert aimed at a partition takes ids itself
        SELECT new_id, s.queue, s.task, CASE WHEN s.blocked THEN 'blocked' ELSE 'pending' END::queueworker.task_state,
               s.payload, s.priority, coalesce(s.run_after, now()), coalesce(s.run_after > now(), false),
               s.max_attempts, s.timeout_seconds, s.dedupe_key, s.run_id, s.run_partition
        FROM specs s ORDER BY s.ord
        ON CONFLICT (queue, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING t.id, t.queue, t.run_after, t.state
    ), edges AS (
        INSERT INTO queueworker.task_dependencies (prerequisite_id, task_id, cancel_on_failure)
        SELECT DISTINCT p.prerequisite_id, s.new_id, s.cancel_on_failure
        FROM unnest(prerequisite_ords, prerequisite_ids) AS p(ord, prerequisite_id)
        JOIN specs s ON s.ord = p.ord
        JOIN inserted i ON i.id = s.new_id
    ), notified AS (
        SELECT queueworker.wake_queue(i.queue, min(i.run_after)) FROM inserted i WHERE i.state = 'pending'
        GROUP BY i.queue
    )
    SELECT s.ord, s.queue, s.dedupe_key, i.id, (SELECT count(*) FROM notified)
    FROM specs s LEFT JOIN inserted i ON i.id = s.new_id
    ORDER BY s.ord;
END
$$;

-- `queueworker run finalize ID --force`: consolidates a failed run on purpose (once every partition
-- has ended); returns whether the run was failed (nothing happens otherwise).
CREATE FUNCTION queueworker.finalize_run(run_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE queueworker.runs SET forced = true, state = 'running', finished_at = NULL
    WHERE id = run_id AND state = 'failed' AND success_task_id IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM queueworker.advance_run(run_id);
    RETURN true;
END
$$;

REVOKE EXECUTE ON FUNCTION
    queueworker.enqueue_tasks(text[], text[], jsonb[], integer[], timestamptz[], integer[], integer[], text[],
                              boolean[], boolean[], bigint[], bigint[], bigint[], integer[]),
    queueworker.settle_dependents(bigint[], bigint[]),
    queueworker.count_run_outcomes(bigint[], bigint[], integer[], text[], text[]),
    queueworker.start_run(text, integer, jsonb, jsonb, text),
    queueworker.finalize_run(bigint)
FROM PUBLIC;

-- Retention takes a finished task's edges with it. A finished prerequisite has already had its say:
-- its dependents were settled when it ended.
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

ANALYZE queueworker.tasks;
