-- queueworker functions: partitioned runs (`queueworker.runs`, `run_events`, `watermarks`).
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE: CREATE OR REPLACE TRIGGER cannot
-- replace a constraint trigger). A SQL-language body is checked when it is created: what it calls
-- must come from an earlier file, or from earlier in the same one. PL/pgSQL bodies are resolved
-- when they run.

-- A run fans out `expected` partition tasks and counts their terminal outcomes (fan-in) in the
-- statements that record them: a completion, a failure, a rescue that fails a task, a cancel, a
-- retry that takes an outcome back. The run's row lock serialises concurrent counts, so they are
-- exact however outcomes are batched. When every partition has succeeded, the run's `on_success`
-- task (the consolidation) is enqueued once, by the statement that counted the last success; when
-- a partition ends failed or cancelled, the run fails and its `on_failure` task (the alert) is
-- enqueued once, and no consolidation happens unless the run is finalised with force. The run
-- succeeds, and its watermark advances (to the run's start: everything before it was covered),
-- only when the consolidation succeeds, or, without one, when the last partition does.

-- Enqueues a run's consolidation or alert from its stored spec; returns the task's id.
CREATE OR REPLACE FUNCTION queueworker.enqueue_run_task(run_id bigint, spec jsonb) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    new_id bigint;
BEGIN
    INSERT INTO queueworker.tasks (queue, task, payload, priority, max_attempts, timeout_seconds, delayed, run_id, key)
    VALUES (coalesce(spec ->> 'queue', 'default'), spec ->> 'task', coalesce(spec -> 'payload', '{}'),
            coalesce((spec ->> 'priority')::integer, 0), coalesce((spec ->> 'max_attempts')::integer, 10),
            (spec ->> 'timeout_seconds')::integer, false, run_id, spec ->> 'key')
    RETURNING id INTO new_id;
    PERFORM queueworker.wake_queue(coalesce(spec ->> 'queue', 'default'), now());
    RETURN new_id;
END
$$;

-- Refuses, at the start of a run, a consolidation or alert spec that enqueue_run_task could not insert
-- when its time comes: that would fail the completion statement of the run's last partition (and
-- with it the rest of that worker's batch), every time it is retried. The rules are the tasks table's.
CREATE OR REPLACE FUNCTION queueworker.check_run_task_spec(spec jsonb, role text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    priority integer;
    max_attempts integer;
    timeout_seconds integer;
BEGIN
    IF spec IS NULL THEN
        RETURN;
    END IF;
    -- The casts enqueue_run_task makes: text that is no integer fails here, as it would there.
    priority := spec ->> 'priority';
    max_attempts := coalesce((spec ->> 'max_attempts')::integer, 10);
    timeout_seconds := spec ->> 'timeout_seconds';
    IF jsonb_typeof(spec) <> 'object' OR coalesce(spec ->> 'queue', 'default') !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'
       OR coalesce(length(spec ->> 'task'), 0) NOT BETWEEN 1 AND 200 OR max_attempts < 1 OR timeout_seconds <= 0
       -- A key as the CHECK tasks_key_text of migration 018 takes it.
       OR length(spec ->> 'key') NOT BETWEEN 1 AND 256 OR spec ->> 'key' ~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]' THEN
        RAISE EXCEPTION 'the run''s % is not a task spec it could enqueue', role USING ERRCODE = 'check_violation';
    END IF;
EXCEPTION WHEN invalid_text_representation OR numeric_value_out_of_range THEN
    RAISE EXCEPTION 'the run''s % is not a task spec it could enqueue', role USING ERRCODE = 'check_violation';
END
$$;

-- Moves a (locked) run on from its counters: consolidation or success when every partition
-- succeeded, failure (and the alert) when one ended failed or cancelled, back to running when a
-- retry took the last failure back. A run fails and gets its alert in one update: one transition,
-- one event.
CREATE OR REPLACE FUNCTION queueworker.advance_run(run_id bigint) RETURNS void
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
        UPDATE queueworker.runs
        SET state = 'failed', finished_at = now(),
            failure_task_id = CASE WHEN r.on_failure IS NOT NULL AND r.failure_task_id IS NULL
                                   THEN queueworker.enqueue_run_task(r.id, r.on_failure)
                                   ELSE r.failure_task_id END
        WHERE id = r.id;
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

-- The run's end: succeeded (its watermark advances to the run's start, and belongs to the run's queues
-- from then on) or failed (untouched).
CREATE OR REPLACE FUNCTION queueworker.finish_run(run_id bigint, success boolean) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r queueworker.runs;
BEGIN
    UPDATE queueworker.runs
    SET state = CASE WHEN success THEN 'succeeded' ELSE 'failed' END::queueworker.run_state, finished_at = now(),
        watermark_after = CASE WHEN success AND watermark IS NOT NULL THEN to_jsonb(started_at) END
    WHERE id = run_id RETURNING * INTO r;
    IF success AND r.watermark IS NOT NULL THEN
        INSERT INTO queueworker.watermarks (name, value, run_id, queues)
        VALUES (r.watermark, r.watermark_after, r.id, r.queues)
        ON CONFLICT (name) DO UPDATE
        SET value = EXCLUDED.value, run_id = EXCLUDED.run_id, queues = EXCLUDED.queues, updated_at = now();
    END IF;
END
$$;

-- Counts terminal outcomes of tasks that belong to runs: (old state, new state) per task. Runs are
-- locked in id order. Called by COMPLETE_SUCCEEDED (its `counted` step) and by the update trigger.
-- Without sequential scans, as settle_dependents (40_dependencies.sql).
CREATE OR REPLACE FUNCTION queueworker.count_run_outcomes(ids bigint[], run_ids bigint[], partitions integer[],
                                                          old_states text[], new_states text[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
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

-- Starts a run: its row, with the watermark as it stands; returns its id. Its partitions are enqueued
-- by the caller (`enqueue_tasks` in worker/db/enqueue.sql, with the run's id), in the same
-- transaction, each in one of `queues`. The run belongs to those queues and to its consolidation's
-- and alert's: the acting login must be allowed all of them (queue grants, 15_queue_grants.sql), and
-- all of those the watermark belongs to, which are those of the run that last advanced it (or, before
-- any did, of the last run started with it), so one tenant cannot move another's watermark on.
CREATE OR REPLACE FUNCTION queueworker.start_run(name text, expected integer, on_success jsonb, on_failure jsonb,
                                                 watermark text, queues text[]) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    run_queues text[];
    owners text[];
    patterns text[] := queueworker.queue_patterns();
    new_id bigint;
BEGIN
    -- A NULL queue is no queue: a run of none would pass the grants' check and own its watermark.
    IF coalesce(cardinality(queues), 0) = 0 OR EXISTS (SELECT FROM unnest(queues) AS q WHERE q IS NULL) THEN
        RAISE EXCEPTION 'a run is started with the queues of its partitions, none of them NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT array_agg(DISTINCT q ORDER BY q) INTO run_queues
    FROM unnest(queues || ARRAY[CASE WHEN on_success IS NOT NULL THEN coalesce(on_success ->> 'queue', 'default') END,
                                CASE WHEN on_failure IS NOT NULL THEN coalesce(on_failure ->> 'queue', 'default') END])
         AS q
    WHERE q IS NOT NULL;
    PERFORM queueworker.require_queues(run_queues);
    PERFORM queueworker.check_run_task_spec(on_success, 'consolidation'), queueworker.check_run_task_spec(on_failure, 'alert');
    SELECT w.queues INTO owners FROM queueworker.watermarks w WHERE w.name = watermark;
    IF NOT FOUND THEN  -- not advanced yet: it belongs to the queues of the last run started with it
        SELECT r.queues INTO owners FROM queueworker.runs r WHERE r.watermark = start_run.watermark
        ORDER BY r.id DESC LIMIT 1;
    END IF;
    IF FOUND AND patterns <> ARRAY['%']
       AND (owners IS NULL OR EXISTS (SELECT FROM unnest(owners) AS o(name) WHERE NOT o.name LIKE ANY (patterns))) THEN
        RAISE EXCEPTION 'login % may not use the watermark %: it belongs to the queues of another producer',
                        session_user, watermark
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO queueworker.runs (name, expected, on_success, on_failure, watermark, watermark_before, queues)
    VALUES (name, expected, on_success, on_failure, watermark,
            (SELECT w.value FROM queueworker.watermarks w WHERE w.name = watermark), run_queues)
    RETURNING id INTO new_id;
    RETURN new_id;
END
$$;

-- Version 15's signature, which its producers call during a rolling upgrade: a run of no declared
-- queues, which only a login free of queue grants may start and add partitions to.
CREATE OR REPLACE FUNCTION queueworker.start_run(name text, expected integer, on_success jsonb, on_failure jsonb,
                                                 watermark text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    new_id bigint;
BEGIN
    IF NOT queueworker.unbound_by_grants() THEN
        RAISE EXCEPTION 'login % may not start a run without naming its queues (a producer older than queue '
                        'grants): upgrade it', session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO queueworker.runs (name, expected, on_success, on_failure, watermark, watermark_before)
    VALUES (name, expected, on_success, on_failure, watermark,
            (SELECT w.value FROM queueworker.watermarks w WHERE w.name = watermark))
    RETURNING id INTO new_id;
    RETURN new_id;
END
$$;

-- `queueworker run finalize ID --force`: consolidates a failed run on purpose (once every partition
-- has ended); returns whether the run was failed (nothing happens otherwise).
CREATE OR REPLACE FUNCTION queueworker.finalize_run(run_id bigint) RETURNS boolean
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

-- The audit trail of runs, `run_events`: one row per transition, written by a trigger on
-- `queueworker.runs` so no statement that moves a run can forget it: started, the consolidation
-- enqueued (running -> running), succeeded, failed (with the alert, if any, in the same row),
-- running again after a retry or a forced finalisation. Counter changes that move nothing are not
-- transitions: the task events of the partitions record those. `by_user` is the login that caused
-- it (`session_user`: a person's `run finalize --force`, a worker's completion).
CREATE OR REPLACE FUNCTION queueworker.audit_run() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO queueworker.run_events (run_id, from_state, to_state, detail)
    VALUES (NEW.id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, NEW.state,
            jsonb_strip_nulls(jsonb_build_object(
                'expected', NEW.expected, 'succeeded', NEW.succeeded, 'failed', NEW.failed,
                'cancelled', NEW.cancelled, 'consolidation', NEW.success_task_id, 'alert', NEW.failure_task_id,
                'forced', NEW.forced)));
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS runs_audit_insert ON queueworker.runs;
CREATE TRIGGER runs_audit_insert AFTER INSERT ON queueworker.runs
    FOR EACH ROW EXECUTE FUNCTION queueworker.audit_run();
DROP TRIGGER IF EXISTS runs_audit_update ON queueworker.runs;
CREATE TRIGGER runs_audit_update AFTER UPDATE ON queueworker.runs
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.success_task_id IS DISTINCT FROM NEW.success_task_id
          OR OLD.failure_task_id IS DISTINCT FROM NEW.failure_task_id)
    EXECUTE FUNCTION queueworker.audit_run();

-- Append-only, like task_events (forbid_event_updates, 10_audit.sql).
DROP TRIGGER IF EXISTS run_events_append_only ON queueworker.run_events;
CREATE TRIGGER run_events_append_only BEFORE UPDATE ON queueworker.run_events
    FOR EACH ROW EXECUTE FUNCTION queueworker.forbid_event_updates();
DROP TRIGGER IF EXISTS run_events_no_truncate ON queueworker.run_events;
CREATE TRIGGER run_events_no_truncate BEFORE TRUNCATE ON queueworker.run_events
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.forbid_event_updates();

REVOKE EXECUTE ON FUNCTION
    queueworker.count_run_outcomes(bigint[], bigint[], integer[], text[], text[]),
    queueworker.start_run(text, integer, jsonb, jsonb, text),
    queueworker.start_run(text, integer, jsonb, jsonb, text, text[]),
    queueworker.finalize_run(bigint),
    queueworker.audit_run()
FROM PUBLIC;
