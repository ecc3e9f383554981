-- The queueworker schema as the migrations leave it: what a reader should find in a freshly migrated
-- database. Generated, do not edit: `pg_dump --schema-only --schema=queueworker --no-owner`, without
-- pg_dump's comments and settings. Checked by tests/test_schema_snapshot.py. Regenerate with:
--     python -m queueworker.dev.schema_snapshot
-- Dumped with Postgres 15.

CREATE SCHEMA queueworker;

CREATE TYPE queueworker.run_state AS ENUM (
    'running',
    'succeeded',
    'failed'
);

CREATE TYPE queueworker.task_state AS ENUM (
    'pending',
    'running',
    'retrying',
    'succeeded',
    'failed',
    'cancelled',
    'blocked'
);

CREATE FUNCTION queueworker.advance_run(run_id bigint) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

CREATE FUNCTION queueworker.audit_queue() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    change text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO queueworker.queue_events (queue, change, detail) VALUES (OLD.name, 'cleared', '{}');
        RETURN NULL;
    END IF;
    change := CASE
        -- its first task with a key (75_fair_share.sql); the ON CONFLICT path changes nothing else
        WHEN NEW.keyed AND ((TG_OP = 'INSERT' AND NOT NEW.limited) OR (TG_OP = 'UPDATE' AND NOT OLD.keyed))
            THEN 'keyed'
        WHEN TG_OP = 'UPDATE' AND OLD.breaker_state IS DISTINCT FROM NEW.breaker_state
            THEN 'breaker_' || NEW.breaker_state
        WHEN TG_OP = 'UPDATE' AND OLD.paused_until IS NOT NULL AND NEW.paused_until IS NULL THEN 'resumed'
        WHEN NEW.paused_until IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.paused_until IS DISTINCT FROM NEW.paused_until)
            THEN 'paused'
        ELSE 'limits' END;
    INSERT INTO queueworker.queue_events (queue, change, detail)
    VALUES (NEW.name, change, jsonb_strip_nulls(jsonb_build_object(
        'paused_until', NEW.paused_until, 'rate_per_second', NEW.rate_per_second, 'burst', NEW.burst,
        'max_running', NEW.max_running, 'breaker_failures', NEW.breaker_failures,
        'breaker_cooldown_seconds', NEW.breaker_cooldown_seconds, 'breaker_state', NEW.breaker_state,
        'consecutive_failures', NEW.consecutive_failures, 'keyed', NULLIF(NEW.keyed, false))));
    RETURN NULL;
END
$$;

CREATE FUNCTION queueworker.audit_queue_key() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO queueworker.queue_events (queue, change, detail)
        VALUES (OLD.queue, 'key_cleared', jsonb_build_object('key', OLD.key));
    ELSE
        INSERT INTO queueworker.queue_events (queue, change, detail)
        VALUES (NEW.queue, 'key_weight', jsonb_build_object('key', NEW.key, 'weight', NEW.weight));
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION queueworker.audit_run() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

CREATE FUNCTION queueworker.audit_task_inserts() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF NOT queueworker.unbound_by_grants() THEN
        PERFORM queueworker.require_queues(ARRAY(SELECT DISTINCT n.queue FROM new_rows n));
    END IF;
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT n.id, NULL, n.state, n.lease_owner, n.lease_token, NULL
    FROM new_rows n;
    RETURN NULL;
END
$$;

CREATE FUNCTION queueworker.audit_task_updates() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
        PERFORM queueworker.settle_dependents(moved);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION queueworker.check_run_task_spec(spec jsonb, role text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
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
$_$;

CREATE FUNCTION queueworker.clean_finished(retention_seconds double precision, batch integer) RETURNS SETOF bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    cutoff timestamptz := queueworker.retention_cutoff(retention_seconds, batch);
BEGIN
    PERFORM FROM queueworker.duty_locks WHERE duty = 'clean_finished' FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH old AS (
        SELECT t.id FROM queueworker.tasks t
        WHERE t.finished_at < cutoff AND t.state IN ('succeeded', 'failed', 'cancelled')
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
    RETURNING t.id;
END
$$;

CREATE FUNCTION queueworker.clean_finished(lock_key bigint, retention_seconds double precision, batch integer) RETURNS SETOF bigint
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT queueworker.clean_finished(retention_seconds, batch)
$$;

CREATE FUNCTION queueworker.clean_queue_events(retention_seconds double precision, batch integer) RETURNS SETOF bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    cutoff timestamptz := queueworker.retention_cutoff(retention_seconds, batch);
BEGIN
    PERFORM FROM queueworker.duty_locks WHERE duty = 'clean_queue_events' FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH old AS (
        SELECT e.id FROM queueworker.queue_events e
        WHERE e.at < cutoff
        ORDER BY e.at
        LIMIT batch
        FOR UPDATE OF e SKIP LOCKED
    )
    DELETE FROM queueworker.queue_events e USING old WHERE e.id = old.id
    RETURNING e.id;
END
$$;

CREATE FUNCTION queueworker.clean_runs(retention_seconds double precision, batch integer) RETURNS SETOF bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    cutoff timestamptz := queueworker.retention_cutoff(retention_seconds, batch);
BEGIN
    PERFORM FROM queueworker.duty_locks WHERE duty = 'clean_runs' FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH old AS (
        -- A run ends after it starts: in the order of the start's index (runs_started), a batch
        -- reads its candidates and stops, and a pass with nothing to delete reads nothing.
        SELECT r.id FROM queueworker.runs r
        WHERE r.started_at < cutoff AND r.finished_at < cutoff AND r.state <> 'running'
          AND NOT EXISTS (SELECT FROM queueworker.tasks t WHERE t.run_id = r.id)
          AND NOT EXISTS (SELECT FROM queueworker.watermarks w WHERE w.run_id = r.id)
        ORDER BY r.started_at
        LIMIT batch
        FOR UPDATE OF r SKIP LOCKED
    ), events AS (
        DELETE FROM queueworker.run_events e USING old WHERE e.run_id = old.id
    )
    DELETE FROM queueworker.runs r USING old
    WHERE r.id = old.id AND r.state <> 'running'
    RETURNING r.id;
END
$$;

CREATE FUNCTION queueworker.clean_watermarks(retention_seconds double precision, batch integer) RETURNS SETOF text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    cutoff timestamptz := queueworker.retention_cutoff(retention_seconds, batch);
BEGIN
    PERFORM FROM queueworker.duty_locks WHERE duty = 'clean_watermarks' FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH stale AS (
        SELECT w.name FROM queueworker.watermarks w
        WHERE w.updated_at < cutoff
          AND NOT EXISTS (SELECT FROM queueworker.runs r WHERE r.state = 'running' AND r.watermark = w.name)
        ORDER BY w.updated_at
        LIMIT batch
        FOR UPDATE OF w SKIP LOCKED
    )
    DELETE FROM queueworker.watermarks w USING stale WHERE w.name = stale.name
    RETURNING w.name;
END
$$;

CREATE FUNCTION queueworker.count_run_outcomes(ids bigint[], run_ids bigint[], partitions integer[], old_states text[], new_states text[]) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

CREATE FUNCTION queueworker.counted_as(prerequisite_state queueworker.task_state, cancel_on_failure boolean) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE WHEN prerequisite_state IN ('blocked', 'pending', 'running', 'retrying') THEN 'waiting'
                WHEN prerequisite_state IN ('failed', 'cancelled') AND cancel_on_failure THEN 'failed'
                ELSE 'done' END
$$;

CREATE FUNCTION queueworker.dependency_verdict(waiting integer, failed integer) RETURNS queueworker.task_state
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE WHEN failed > 0 THEN 'cancelled' WHEN waiting = 0 THEN 'pending' ELSE 'blocked' END
           ::queueworker.task_state
$$;

CREATE FUNCTION queueworker.enqueue_run_task(run_id bigint, spec jsonb) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

CREATE FUNCTION queueworker.enqueue_tasks(queues text[], tasks text[], payloads jsonb[], priorities integer[], run_afters timestamp with time zone[], max_attempts integer[], timeouts integer[], dedupe_keys text[], by_spec boolean[], cancel_on_failure boolean[], prerequisite_ords bigint[], prerequisite_ids bigint[], run_ids bigint[], run_partitions integer[]) RETURNS TABLE(ord bigint, queue text, dedupe_key text, id bigint, notified bigint)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT * FROM queueworker.enqueue_tasks(queues, tasks, payloads, priorities, run_afters, max_attempts, timeouts,
                                            dedupe_keys, by_spec, cancel_on_failure, prerequisite_ords,
                                            prerequisite_ids, run_ids, run_partitions, NULL::jsonb[], NULL::text[])
$$;

CREATE FUNCTION queueworker.enqueue_tasks(queues text[], tasks text[], payloads jsonb[], priorities integer[], run_afters timestamp with time zone[], max_attempts integer[], timeouts integer[], dedupe_keys text[], by_spec boolean[], cancel_on_failure boolean[], prerequisite_ords bigint[], prerequisite_ids bigint[], run_ids bigint[], run_partitions integer[], headers jsonb[]) RETURNS TABLE(ord bigint, queue text, dedupe_key text, id bigint, notified bigint)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT * FROM queueworker.enqueue_tasks(queues, tasks, payloads, priorities, run_afters, max_attempts, timeouts,
                                            dedupe_keys, by_spec, cancel_on_failure, prerequisite_ords,
                                            prerequisite_ids, run_ids, run_partitions, headers, NULL::text[])
$$;

CREATE FUNCTION queueworker.enqueue_tasks(queues text[], tasks text[], payloads jsonb[], priorities integer[], run_afters timestamp with time zone[], max_attempts integer[], timeouts integer[], dedupe_keys text[], by_spec boolean[], cancel_on_failure boolean[], prerequisite_ords bigint[], prerequisite_ids bigint[], run_ids bigint[], run_partitions integer[], headers jsonb[], keys text[]) RETURNS TABLE(ord bigint, queue text, dedupe_key text, id bigint, notified bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    unknown bigint;
    misfit text;
    crowded bigint;
    patterns text[] := queueworker.queue_patterns();
BEGIN
    PERFORM queueworker.require_queues(queues);
    -- A dependent's edges are settled in its enqueue's commit: their number is bounded (as
    -- queueworker.names.MAX_PREREQUISITES bounds TaskSpec.depends_on).
    SELECT o INTO crowded FROM unnest(prerequisite_ords) AS o GROUP BY o HAVING count(*) > 1000 LIMIT 1;
    IF crowded IS NOT NULL THEN
        RAISE EXCEPTION 'task % of this enqueue has more than 1000 prerequisites', crowded
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    SELECT p INTO unknown FROM unnest(prerequisite_ids) AS p
    WHERE NOT EXISTS (SELECT 1 FROM queueworker.tasks t WHERE t.id = p AND t.queue LIKE ANY (patterns)) LIMIT 1;
    IF unknown IS NOT NULL THEN
        RAISE EXCEPTION 'there is no task % to depend on', unknown USING ERRCODE = 'foreign_key_violation';
    END IF;
    -- A run counts `expected` partitions, numbered from 0, one task each: a partition outside that
    -- range, twice, or a unique task (which could turn out to be another, not counted) would count
    -- more outcomes than the run expects, and the statement that counted them (a completion, or the
    -- rescue of every queue) would fail for good.
    -- The runs are held (FOR KEY SHARE) until this transaction ends, so retention (clean_runs) cannot
    -- delete one between this check and the insert; a partition joins only a running run.
    PERFORM FROM queueworker.runs r WHERE r.id = ANY(run_ids) ORDER BY r.id FOR KEY SHARE;
    WITH given AS (
        SELECT s.run_id, s.run_partition, s.dedupe_key, s.by_spec, s.queue
        FROM unnest(run_ids, run_partitions, dedupe_keys, by_spec, queues)
             AS s(run_id, run_partition, dedupe_key, by_spec, queue)
        WHERE s.run_id IS NOT NULL
    ), doubled AS (
        SELECT g.run_id, g.run_partition FROM given g GROUP BY g.run_id, g.run_partition HAVING count(*) > 1
    )
    SELECT format('run %s, partition %s', g.run_id, coalesce(g.run_partition::text, 'none')) INTO misfit
    FROM given g LEFT JOIN queueworker.runs r ON r.id = g.run_id
    WHERE r.id IS NULL OR r.state <> 'running' OR g.run_partition IS NULL OR g.run_partition NOT BETWEEN 0 AND r.expected - 1
       OR g.queue IS NULL OR g.queue <> ALL (coalesce(r.queues, ARRAY[g.queue]))
       -- A run of queues the login may not use is not its own (nor one started before queue grants).
       OR (patterns <> ARRAY['%'] AND (r.queues IS NULL OR EXISTS (SELECT FROM unnest(r.queues) AS q(name)
                                                                   WHERE NOT q.name LIKE ANY (patterns))))
       OR g.dedupe_key IS NOT NULL OR coalesce(g.by_spec, false)
       OR EXISTS (SELECT 1 FROM doubled d WHERE d.run_id = g.run_id AND d.run_partition = g.run_partition)
       OR EXISTS (SELECT 1 FROM queueworker.tasks t WHERE t.run_id = g.run_id AND t.run_partition = g.run_partition)
    LIMIT 1;
    IF misfit IS NOT NULL THEN
        RAISE EXCEPTION 'not a partition its run can count: %', misfit
            USING ERRCODE = 'check_violation',
                  HINT = 'a run''s partitions are numbered 0 to expected - 1, one task each, none unique, '
                         'each in one of the queues the run was started with';
    END IF;
    RETURN QUERY
    WITH specs AS MATERIALIZED (
        SELECT s.ord, s.queue, s.task, s.payload, s.priority, s.run_after, s.max_attempts, s.timeout_seconds,
               s.cancel_on_failure, s.run_id, s.run_partition, s.headers, s.key,
               nextval('queueworker.tasks_id_seq') AS new_id,
               CASE WHEN s.by_spec THEN encode(queueworker.spec_hash(s.queue, s.task, s.payload), 'hex')
                    ELSE s.dedupe_key END AS dedupe_key,
               s.ord = ANY(prerequisite_ords) AS blocked
        FROM unnest(queues, tasks, payloads, priorities, run_afters, max_attempts, timeouts, dedupe_keys, by_spec,
                    cancel_on_failure, run_ids, run_partitions, headers, keys)
             WITH ORDINALITY AS s(queue, task, payload, priority, run_after, max_attempts, timeout_seconds,
                                  dedupe_key, by_spec, cancel_on_failure, run_id, run_partition, headers, key, ord)
        ORDER BY s.ord
    ), inserted AS (
        INSERT INTO queueworker.tasks_active AS t
            (id, queue, task, state, payload, priority, run_after, delayed, max_attempts, timeout_seconds, dedupe_key,
             run_id, run_partition, headers, key)
        OVERRIDING SYSTEM VALUE  -- the identity is the parent's: an insert aimed at a partition takes ids itself
        SELECT new_id, s.queue, s.task, CASE WHEN s.blocked THEN 'blocked' ELSE 'pending' END::queueworker.task_state,
               s.payload, s.priority, coalesce(s.run_after, now()), coalesce(s.run_after > now(), false),
               s.max_attempts, s.timeout_seconds, s.dedupe_key, s.run_id, s.run_partition, s.headers, s.key
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

CREATE FUNCTION queueworker.existing_tasks(ords bigint[], queues text[], dedupe_keys text[]) RETURNS TABLE(ord bigint, id bigint, state text)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM queueworker.require_queues(queues);
    RETURN QUERY
    SELECT k.ord, t.id, t.state::text
    FROM unnest(ords, queues, dedupe_keys) AS k(ord, queue, dedupe_key)
    CROSS JOIN LATERAL (
        SELECT x.id, x.state FROM queueworker.tasks x
        WHERE x.queue = k.queue AND x.dedupe_key = k.dedupe_key
        ORDER BY x.state IN ('succeeded', 'failed', 'cancelled'), x.id DESC
        LIMIT 1
    ) t
    ORDER BY k.ord;
END
$$;

CREATE FUNCTION queueworker.fair_tag_inserts() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    newly_keyed text[];
BEGIN
    IF EXISTS (SELECT FROM new_rows n WHERE n.key IS NOT NULL) THEN
        SELECT array_agg(d.queue ORDER BY d.queue) INTO newly_keyed
        FROM (SELECT DISTINCT n.queue FROM new_rows n WHERE n.key IS NOT NULL) AS d
        WHERE NOT EXISTS (SELECT FROM queueworker.queues q WHERE q.name = d.queue AND q.keyed);
        IF newly_keyed IS NOT NULL THEN
            INSERT INTO queueworker.queues (name, keyed) SELECT unnest(newly_keyed), true
            ON CONFLICT (name) DO UPDATE SET keyed = true, updated_at = now();
            PERFORM pg_notify('queueworker_queues', q) FROM unnest(newly_keyed) AS q;
            PERFORM queueworker.tag_fair(
                ARRAY(SELECT t.id FROM queueworker.tasks_active t
                      WHERE t.queue = ANY(newly_keyed) AND t.state = 'pending' AND NOT t.delayed),
                ARRAY(SELECT t.id FROM queueworker.tasks_active t
                      WHERE t.queue = ANY(newly_keyed) AND t.state = 'pending' AND NOT t.delayed
                        AND t.fair_tag IS NOT NULL));
        END IF;
    END IF;
    IF NOT EXISTS (SELECT FROM queueworker.queues q WHERE q.keyed) THEN
        RETURN NULL;
    END IF;
    PERFORM queueworker.tag_fair(c.ids, c.stale)
    FROM (SELECT array_agg(n.id) AS ids, array_agg(n.id) FILTER (WHERE n.fair_tag IS NOT NULL) AS stale
          FROM new_rows n JOIN queueworker.queues q ON q.name = n.queue AND q.keyed
          WHERE n.state = 'pending' AND NOT n.delayed
            AND n.queue <> ALL(coalesce(newly_keyed, '{}'))) AS c
    WHERE c.ids IS NOT NULL;
    RETURN NULL;
END
$$;

CREATE FUNCTION queueworker.fair_tag_updates() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM queueworker.queues q WHERE q.keyed) THEN
        RETURN NULL;
    END IF;
    PERFORM queueworker.tag_fair(c.ids, c.stale)
    FROM (SELECT array_agg(n.id) AS ids, array_agg(n.id) FILTER (WHERE n.fair_tag IS NOT NULL) AS stale
          FROM new_rows n
          JOIN old_rows o ON o.id = n.id
          JOIN queueworker.queues q ON q.name = n.queue AND q.keyed
          WHERE n.state = 'pending' AND NOT n.delayed
            AND (NOT (o.state = 'pending' AND NOT o.delayed) OR n.priority <> o.priority)) AS c
    WHERE c.ids IS NOT NULL;
    RETURN NULL;
END
$$;

CREATE FUNCTION queueworker.fill_spec_hash() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    NEW.spec_hash := queueworker.spec_hash(NEW.queue, NEW.task, NEW.payload);
    RETURN NEW;
END
$$;

CREATE FUNCTION queueworker.finalize_run(run_id bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

CREATE FUNCTION queueworker.finish_run(run_id bigint, success boolean) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

CREATE FUNCTION queueworker.forbid_event_updates() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'queueworker.% is an append-only audit log', TG_TABLE_NAME;
END
$$;

CREATE FUNCTION queueworker.glob_like(pattern text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(
               pattern, '\', '\\'), '%', '\%'), '_', '\_'), '*', '%'), '?', '_')
$$;

CREATE FUNCTION queueworker.grant_queue(grantee text, pattern text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
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
$_$;

CREATE FUNCTION queueworker.mark_notify_on_finish(ids bigint[]) RETURNS SETOF bigint
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    UPDATE queueworker.tasks SET notify_on_finish = true
    WHERE id = ANY(ids) AND NOT notify_on_finish AND queue LIKE ANY ((SELECT queueworker.queue_patterns())::text[])
    RETURNING id
$$;

CREATE FUNCTION queueworker.notify_finished() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pg_catalog.pg_notify('queueworker_finished', n.id::text)
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.notify_on_finish AND n.state IN ('succeeded', 'failed', 'cancelled')
      AND n.state IS DISTINCT FROM o.state;
    RETURN NULL;
END
$$;

CREATE FUNCTION queueworker.queue_patterns() RETURNS text[]
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE WHEN queueworker.unbound_by_grants() THEN ARRAY['%']
                ELSE ARRAY(SELECT queueworker.glob_like(g.pattern)
                           FROM queueworker.queue_grants g JOIN pg_roles r ON r.rolname = g.grantee
                           WHERE pg_has_role(session_user, r.oid, 'MEMBER')
                           ORDER BY g.pattern) END
$$;

CREATE FUNCTION queueworker.replace_pending(ids bigint[], payloads jsonb[], priorities integer[], run_afters timestamp with time zone[]) RETURNS TABLE(id bigint, notified bigint)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    WITH r AS (
        SELECT DISTINCT ON (r.id) r.id, r.payload, r.priority, r.run_after
        FROM unnest(ids, payloads, priorities, run_afters) WITH ORDINALITY AS r(id, payload, priority, run_after, ord)
        ORDER BY r.id, r.ord DESC
    ), replaced AS (
        UPDATE queueworker.tasks t
        SET payload = r.payload, priority = r.priority, run_after = coalesce(r.run_after, least(t.run_after, now())),
            delayed = coalesce(r.run_after > now(), false), updated_at = now()
        FROM r
        WHERE t.id = r.id AND t.state = 'pending' AND t.dedupe_key IS NOT NULL
          AND t.queue LIKE ANY ((SELECT queueworker.queue_patterns())::text[])
          AND (t.payload IS DISTINCT FROM r.payload OR t.priority IS DISTINCT FROM r.priority
               OR t.run_after IS DISTINCT FROM coalesce(r.run_after, least(t.run_after, now())))
        RETURNING t.id, t.queue, t.run_after
    ), notified AS (
        SELECT queueworker.wake_queue(queue, min(run_after)) FROM replaced GROUP BY queue
    )
    SELECT id, (SELECT count(*) FROM notified) FROM replaced ORDER BY id
$$;

CREATE TABLE queueworker.tasks (
    id bigint NOT NULL,
    queue text DEFAULT 'default'::text NOT NULL,
    task text NOT NULL,
    state queueworker.task_state DEFAULT 'pending'::queueworker.task_state NOT NULL,
    delayed boolean DEFAULT true NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    run_after timestamp with time zone DEFAULT now() NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 10 NOT NULL,
    rescues integer DEFAULT 0 NOT NULL,
    timeout_seconds integer,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    result jsonb,
    error jsonb,
    lease_owner uuid,
    lease_token bigint DEFAULT 0 NOT NULL,
    leased_until timestamp with time zone,
    deadline_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    spec_hash bytea NOT NULL,
    dedupe_key text,
    run_id bigint,
    run_partition integer,
    progress jsonb,
    checkpoint jsonb,
    continued_from bigint,
    notify_on_finish boolean DEFAULT false NOT NULL,
    headers jsonb,
    prerequisites_waiting integer DEFAULT 0 NOT NULL,
    prerequisites_failed integer DEFAULT 0 NOT NULL,
    key text,
    fair_tag double precision,
    CONSTRAINT dedupe_key_length CHECK (((length(dedupe_key) >= 1) AND (length(dedupe_key) <= 512))),
    CONSTRAINT run_after_readable CHECK (((run_after >= '0002-01-01 00:00:00+00'::timestamp with time zone) AND (run_after <= '9999-12-30 00:00:00+00'::timestamp with time zone))),
    CONSTRAINT running_has_lease CHECK (((state <> 'running'::queueworker.task_state) OR ((lease_owner IS NOT NULL) AND (leased_until IS NOT NULL) AND (deadline_at IS NOT NULL)))),
    CONSTRAINT tasks_attempts_check1 CHECK ((attempts >= 0)),
    CONSTRAINT tasks_max_attempts_check1 CHECK ((max_attempts >= 1)),
    CONSTRAINT tasks_queue_check1 CHECK ((queue ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'::text)),
    CONSTRAINT tasks_task_check1 CHECK (((length(task) >= 1) AND (length(task) <= 200))),
    CONSTRAINT tasks_timeout_seconds_check1 CHECK ((timeout_seconds > 0))
)
PARTITION BY LIST (state);

CREATE FUNCTION queueworker.replaced_columns(new_row queueworker.tasks, old_row queueworker.tasks) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT pg_catalog.jsonb_agg(name ORDER BY name) FROM (VALUES
        ('payload', new_row.payload IS DISTINCT FROM old_row.payload),
        ('priority', new_row.priority IS DISTINCT FROM old_row.priority),
        ('run_after', new_row.run_after IS DISTINCT FROM old_row.run_after)) AS c(name, changed)
    WHERE changed
$$;

CREATE FUNCTION queueworker.require_queues(queues text[]) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

CREATE FUNCTION queueworker.retention_cutoff(retention_seconds double precision, batch integer) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    -- NaN compares greater than every number in Postgres, so BETWEEN refuses it with infinity.
    IF (retention_seconds BETWEEN 0 AND 2147483647) IS NOT TRUE THEN
        RAISE EXCEPTION 'a retention is 0 to 2147483647 seconds, not %', coalesce(retention_seconds::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (batch BETWEEN 1 AND 100000) IS NOT TRUE THEN
        RAISE EXCEPTION 'a retention batch is 1 to 100000 rows, not %', coalesce(batch::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN now() - make_interval(secs => retention_seconds);
END
$$;

CREATE FUNCTION queueworker.revoke_queue(grantee text, pattern text) RETURNS boolean
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    WITH revoked AS (
        DELETE FROM queueworker.queue_grants g WHERE g.grantee = revoke_queue.grantee AND g.pattern = revoke_queue.pattern
        RETURNING 1
    )
    SELECT count(*) > 0 FROM revoked
$$;

CREATE FUNCTION queueworker.settle_cascade(prerequisites bigint[], dependents bigint[]) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET jit TO 'off'
    AS $$
DECLARE
    outer_setting text := coalesce(current_setting('queueworker.settling', true), '');
BEGIN
    PERFORM set_config('queueworker.settling', 'on', true);
    prerequisites := queueworker.settle_edges(prerequisites, dependents);
    WHILE cardinality(prerequisites) > 0 LOOP
        prerequisites := queueworker.settle_edges(prerequisites, '{}');
    END LOOP;
    PERFORM set_config('queueworker.settling', outer_setting, true);
END
$$;

CREATE FUNCTION queueworker.settle_dependents(prerequisites bigint[]) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF coalesce(cardinality(prerequisites), 0) = 0 OR NOT EXISTS (
            SELECT FROM queueworker.task_dependencies d WHERE d.prerequisite_id = ANY(prerequisites)) THEN
        RETURN;
    END IF;
    PERFORM queueworker.settle_cascade(prerequisites, '{}');
END
$$;

CREATE FUNCTION queueworker.settle_dependents(prerequisites bigint[], succeeded bigint[]) RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT queueworker.settle_dependents(prerequisites)
$$;

CREATE FUNCTION queueworker.settle_edges(prerequisites bigint[], dependents bigint[]) RETURNS bigint[]
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    moved_ids bigint[];
    waiting_deltas integer[];
    failed_deltas integer[];
    onward bigint[];
BEGIN
    -- The edges are found from the ids given, through the two indexes of the edges (a plan that
    -- scanned every blocked task instead would make each settlement cost the whole graph).
    WITH candidate AS MATERIALIZED (
        SELECT d.prerequisite_id, d.task_id, d.cancel_on_failure, d.counted
        FROM queueworker.task_dependencies d WHERE d.prerequisite_id = ANY(prerequisites)
        UNION ALL
        SELECT d.prerequisite_id, d.task_id, d.cancel_on_failure, d.counted
        FROM queueworker.task_dependencies d WHERE d.task_id = ANY(dependents) AND d.prerequisite_id <> ALL(prerequisites)
    ), edge AS (
        SELECT c.prerequisite_id, c.task_id, c.counted AS was,
               queueworker.counted_as(p.state, c.cancel_on_failure) AS now_counted
        FROM candidate c
        JOIN queueworker.tasks t ON t.id = c.task_id
        LEFT JOIN queueworker.tasks p ON p.id = c.prerequisite_id
        WHERE t.state = 'blocked' OR (t.state = 'cancelled' AND t.error ->> 'type' = 'DependencyFailed')
    ), recounted AS (
        UPDATE queueworker.task_dependencies d SET counted = e.now_counted
        FROM edge e
        WHERE (d.prerequisite_id = ANY(prerequisites) OR d.task_id = ANY(dependents))  -- by the indexes, again
          AND d.prerequisite_id = e.prerequisite_id AND d.task_id = e.task_id
          AND d.counted IS DISTINCT FROM e.now_counted
        RETURNING d.task_id, e.was, e.now_counted
    )
    SELECT array_agg(task_id ORDER BY task_id), array_agg(waiting ORDER BY task_id),
           array_agg(failed ORDER BY task_id)
    INTO moved_ids, waiting_deltas, failed_deltas
    FROM (SELECT task_id,
                 sum((now_counted = 'waiting')::integer - (was IS NOT DISTINCT FROM 'waiting')::integer) AS waiting,
                 sum((now_counted = 'failed')::integer - (was IS NOT DISTINCT FROM 'failed')::integer) AS failed
          FROM recounted GROUP BY task_id) AS delta;
    IF moved_ids IS NULL THEN
        RETURN '{}';
    END IF;
    -- The dependents, locked in id order (concurrent settlements never wait in a circle), with
    -- their states as locked; each one's new sums are its latest row's plus the deltas.
    WITH locked AS MATERIALIZED (
        SELECT t.id, t.state FROM queueworker.tasks t
        WHERE t.id = ANY(moved_ids)
          AND (t.state = 'blocked' OR (t.state = 'cancelled' AND t.error ->> 'type' = 'DependencyFailed'))
        ORDER BY t.id
        FOR NO KEY UPDATE OF t
    ), change AS (
        SELECT c.id, c.waiting, c.failed, l.state AS old_state
        FROM unnest(moved_ids, waiting_deltas, failed_deltas) AS c(id, waiting, failed)
        JOIN locked l ON l.id = c.id
    ), changed AS (
        UPDATE queueworker.tasks t
        SET prerequisites_waiting = t.prerequisites_waiting + c.waiting,
            prerequisites_failed = t.prerequisites_failed + c.failed,
            state = queueworker.dependency_verdict(t.prerequisites_waiting + c.waiting,
                                                   t.prerequisites_failed + c.failed),
            error = CASE WHEN t.prerequisites_failed + c.failed = 0 THEN NULL
                         WHEN t.state = 'cancelled' AND EXISTS (
                             SELECT FROM queueworker.task_dependencies k
                             WHERE k.task_id = t.id AND k.counted = 'failed'
                               AND k.prerequisite_id = (t.error ->> 'prerequisite')::bigint) THEN t.error
                         ELSE (SELECT jsonb_build_object(
                                   'type', 'DependencyFailed', 'prerequisite', p.id, 'root', r.root, 'retryable', false,
                                   'message', format('prerequisite task %s ended %s', p.id, p.state)
                                              || CASE WHEN r.root <> p.id
                                                      THEN format(' (after task %s ended)', r.root) ELSE '' END)
                               FROM queueworker.task_dependencies k
                               JOIN queueworker.tasks p ON p.id = k.prerequisite_id,
                               LATERAL (SELECT coalesce(CASE WHEN p.error ->> 'type' = 'DependencyFailed'
                                                             THEN (p.error ->> 'root')::bigint END, p.id) AS root) r
                               WHERE k.task_id = t.id AND k.counted = 'failed'
                               ORDER BY k.prerequisite_id LIMIT 1) END,
            finished_at = CASE WHEN t.prerequisites_failed + c.failed = 0 THEN NULL
                               WHEN t.state = 'cancelled' THEN t.finished_at ELSE now() END,
            delayed = CASE WHEN t.prerequisites_failed + c.failed = 0 AND t.prerequisites_waiting + c.waiting = 0
                           THEN t.run_after > now() ELSE t.delayed END,
            updated_at = now()
        FROM change c
        WHERE t.id = ANY(moved_ids) AND t.id = c.id
        RETURNING t.id, t.queue, t.state, t.run_after, c.old_state
    ), woken AS (
        SELECT queueworker.wake_queue(queue, min(run_after)) FROM changed
        WHERE state = 'pending' AND old_state <> 'pending' GROUP BY queue
    )
    SELECT array_agg(id) FILTER (WHERE (state = 'cancelled') <> (old_state = 'cancelled'))
    INTO onward
    FROM changed, (SELECT count(*) FROM woken) AS w;
    RETURN coalesce(onward, '{}');
END
$$;

CREATE FUNCTION queueworker.settle_new_dependent() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    fresh bigint[];
BEGIN
    IF NOT EXISTS (SELECT FROM queueworker.task_dependencies d WHERE d.task_id = NEW.id AND d.counted IS NULL) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(DISTINCT d.task_id) INTO fresh FROM queueworker.task_dependencies d WHERE d.counted IS NULL;
    LOOP
        BEGIN
            PERFORM FROM (
                SELECT p.id FROM queueworker.tasks p
                WHERE p.id IN (SELECT d.prerequisite_id FROM queueworker.task_dependencies d
                               WHERE d.task_id = ANY(fresh))
                ORDER BY p.id
                FOR KEY SHARE OF p) AS prerequisites;
            EXIT;
        EXCEPTION WHEN serialization_failure OR deadlock_detected THEN
            NULL;  -- its locks are released with the block: wait again, in a new statement
        END;
    END LOOP;
    PERFORM queueworker.settle_cascade('{}', fresh);
    UPDATE queueworker.task_dependencies d SET counted = 'done' WHERE d.task_id = ANY(fresh) AND d.counted IS NULL;
    RETURN NULL;
END
$$;

CREATE FUNCTION queueworker.spec_hash(queue text, task text, payload jsonb) RETURNS bytea
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT pg_catalog.sha256(pg_catalog.convert_to(pg_catalog.jsonb_build_array(queue, task, payload)::text, 'UTF8'))
$$;

CREATE FUNCTION queueworker.start_run(name text, expected integer, on_success jsonb, on_failure jsonb, watermark text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

CREATE FUNCTION queueworker.start_run(name text, expected integer, on_success jsonb, on_failure jsonb, watermark text, queues text[]) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

CREATE FUNCTION queueworker.tag_fair(ids bigint[], stale bigint[]) RETURNS void
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    UPDATE queueworker.tasks_active t SET fair_tag = NULL
    FROM unnest(stale) AS s(id) WHERE t.id = s.id AND t.fair_tag IS NOT NULL;
    -- No join between groups and rows (the planner cannot know how many of either there are): a
    -- window numbers each group's rows, the first row of each group makes the group's probes (a
    -- CASE evaluates its subqueries only where its branch is taken), and a window hands the
    -- group's start and step to its other rows. Every row is found by its primary key. `probed`
    -- is MATERIALIZED and sorted whole by the last window before the first row is updated: a probe
    -- made while the update ran would walk past the index entries this very statement had just
    -- added (invisible to it), and cost grew with the square of the batch.
    WITH ranked AS MATERIALIZED (
        SELECT t.id, t.queue, t.key, t.priority,
               row_number() OVER (PARTITION BY t.queue, t.key, t.priority ORDER BY t.id) AS rank
        FROM unnest(ids) AS u(id)
        JOIN queueworker.tasks_active t ON t.id = u.id
        WHERE t.state = 'pending' AND NOT t.delayed
    ), probed AS MATERIALIZED (
        SELECT r.id, r.queue, r.key, r.priority, r.rank,
               CASE WHEN r.rank = 1 THEN greatest(
                   (SELECT f.fair_tag FROM queueworker.tasks_active f
                    WHERE f.queue = r.queue AND f.priority = r.priority
                      AND f.state = 'pending' AND NOT f.delayed AND f.fair_tag IS NOT NULL
                    ORDER BY f.priority DESC, f.fair_tag, f.id LIMIT 1),
                   CASE WHEN r.key IS NULL
                        THEN (SELECT max(f.fair_tag) FROM queueworker.tasks_active f
                              WHERE f.queue = r.queue AND f.key IS NULL AND f.priority = r.priority
                                AND f.state = 'pending' AND NOT f.delayed AND f.fair_tag IS NOT NULL)
                        ELSE (SELECT max(f.fair_tag) FROM queueworker.tasks_active f
                              WHERE f.queue = r.queue AND f.key = r.key AND f.priority = r.priority
                                AND f.state = 'pending' AND NOT f.delayed AND f.fair_tag IS NOT NULL) END,
                   0) END AS start,
               CASE WHEN r.rank = 1 THEN 1.0 / coalesce(
                   (SELECT w.weight FROM queueworker.queue_keys w WHERE w.queue = r.queue AND w.key = r.key),
                   1.0) END AS step
        FROM ranked r
    ), tags AS (
        SELECT p.id,
               max(p.start) OVER g + p.rank * max(p.step) OVER g AS tag
        FROM probed p
        WINDOW g AS (PARTITION BY p.queue, p.key, p.priority)
    )
    UPDATE queueworker.tasks_active t
    SET fair_tag = g.tag
    FROM tags g
    WHERE t.id = g.id AND t.state = 'pending' AND NOT t.delayed;
$$;

CREATE FUNCTION queueworker.transition_detail(attempts integer, new_error jsonb, old_error jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'attempts', attempts,
        'error', CASE WHEN new_error IS DISTINCT FROM old_error THEN new_error -> 'message' END,
        'error_type', CASE WHEN new_error IS DISTINCT FROM old_error THEN new_error -> 'type' END))
$$;

CREATE FUNCTION queueworker.unbound_by_grants() RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT NOT EXISTS (SELECT FROM queueworker.queue_grants)
        OR EXISTS (SELECT FROM pg_roles r
                   WHERE (r.oid = (SELECT nspowner FROM pg_namespace WHERE nspname = 'queueworker')
                          OR r.rolname IN ('queueworker_worker', 'queueworker_controller', 'queueworker_operator'))
                     AND pg_has_role(session_user, r.oid, 'MEMBER'))
$$;

CREATE FUNCTION queueworker.wake_queue(queue text, earliest timestamp with time zone) RETURNS void
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT pg_catalog.pg_notify('queueworker', CASE WHEN earliest <= now() THEN queue
                                                    ELSE queue || ' ' || extract(epoch FROM earliest)::text END)
$$;

CREATE TABLE queueworker.cron_jobs (
    name text NOT NULL,
    expression text NOT NULL,
    timezone text DEFAULT 'UTC'::text NOT NULL,
    task text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    queue text DEFAULT 'default'::text NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 10 NOT NULL,
    catch_up text DEFAULT 'none'::text NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    source text NOT NULL,
    next_slot timestamp with time zone NOT NULL,
    last_enqueued_slot timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    key text,
    CONSTRAINT cron_catch_up CHECK ((catch_up = ANY (ARRAY['none'::text, 'latest'::text, 'all'::text]))),
    CONSTRAINT cron_expression_length CHECK (((length(expression) >= 1) AND (length(expression) <= 200))),
    CONSTRAINT cron_jobs_key_text CHECK (((key IS NULL) OR (((length(key) >= 1) AND (length(key) <= 256)) AND (key !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]'::text)))),
    CONSTRAINT cron_jobs_queue_pattern CHECK ((queue ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'::text)),
    CONSTRAINT cron_max_attempts CHECK (((max_attempts >= 1) AND (max_attempts <= 1000))),
    CONSTRAINT cron_name_length CHECK (((length(name) >= 1) AND (length(name) <= 200))),
    CONSTRAINT cron_source CHECK ((source = ANY (ARRAY['code'::text, 'runtime'::text]))),
    CONSTRAINT cron_task_length CHECK (((length(task) >= 1) AND (length(task) <= 200))),
    CONSTRAINT cron_timezone_length CHECK (((length(timezone) >= 1) AND (length(timezone) <= 100)))
);

CREATE TABLE queueworker.duty_locks (
    duty text NOT NULL
);

CREATE VIEW queueworker.new_tasks AS
 SELECT tasks.id,
    tasks.queue,
    tasks.task,
    tasks.payload,
    tasks.priority,
    tasks.run_after,
    tasks.delayed,
    tasks.max_attempts,
    tasks.timeout_seconds,
    tasks.headers,
    tasks.key,
    tasks.spec_hash
   FROM queueworker.tasks
  WHERE false;

CREATE TABLE queueworker.queue_events (
    id bigint NOT NULL,
    queue text NOT NULL,
    change text NOT NULL,
    detail jsonb NOT NULL,
    by_user text DEFAULT SESSION_USER NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE queueworker.queue_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME queueworker.queue_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE queueworker.queue_grants (
    grantee text NOT NULL,
    pattern text NOT NULL,
    granted_by text DEFAULT SESSION_USER NOT NULL,
    granted_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT queue_grants_grantee_check CHECK (((length(grantee) >= 1) AND (length(grantee) <= 63))),
    CONSTRAINT queue_grants_pattern_check CHECK ((pattern ~ '^[A-Za-z0-9_.:*?-]{1,128}$'::text))
);

CREATE TABLE queueworker.queue_keys (
    queue text NOT NULL,
    key text NOT NULL,
    weight double precision NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT queue_keys_key_text CHECK ((((length(key) >= 1) AND (length(key) <= 256)) AND (key !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]'::text))),
    CONSTRAINT queue_keys_queue_check CHECK (((length(queue) >= 1) AND (length(queue) <= 200))),
    CONSTRAINT queue_keys_weight_check CHECK (((weight >= (0.001)::double precision) AND (weight <= (1000)::double precision)))
);

CREATE TABLE queueworker.queues (
    name text NOT NULL,
    paused_until timestamp with time zone,
    rate_per_second double precision,
    burst integer,
    tokens double precision DEFAULT 0 NOT NULL,
    tokens_at timestamp with time zone DEFAULT now() NOT NULL,
    max_running integer,
    breaker_failures integer,
    breaker_cooldown_seconds double precision,
    breaker_state text DEFAULT 'closed'::text NOT NULL,
    consecutive_failures integer DEFAULT 0 NOT NULL,
    breaker_changed_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    limited boolean GENERATED ALWAYS AS (((paused_until IS NOT NULL) OR (rate_per_second IS NOT NULL) OR (max_running IS NOT NULL) OR (breaker_failures IS NOT NULL))) STORED,
    keyed boolean DEFAULT false NOT NULL,
    CONSTRAINT queues_breaker_cooldown_seconds_check CHECK (((breaker_cooldown_seconds > (0)::double precision) AND (breaker_cooldown_seconds <= (31536000)::double precision))),
    CONSTRAINT queues_breaker_failures_check CHECK (((breaker_failures >= 1) AND (breaker_failures <= 1000000))),
    CONSTRAINT queues_breaker_state_check CHECK ((breaker_state = ANY (ARRAY['closed'::text, 'open'::text, 'half_open'::text]))),
    CONSTRAINT queues_burst_check CHECK (((burst >= 1) AND (burst <= 1000000))),
    CONSTRAINT queues_check CHECK (((rate_per_second IS NULL) = (burst IS NULL))),
    CONSTRAINT queues_check1 CHECK (((breaker_failures IS NULL) = (breaker_cooldown_seconds IS NULL))),
    CONSTRAINT queues_max_running_check CHECK (((max_running >= 1) AND (max_running <= 1000000))),
    CONSTRAINT queues_name_check CHECK (((length(name) >= 1) AND (length(name) <= 200))),
    CONSTRAINT queues_name_pattern CHECK ((name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'::text)),
    CONSTRAINT queues_rate_per_second_check CHECK (((rate_per_second > (0)::double precision) AND (rate_per_second <= ('1000000'::numeric)::double precision)))
);

CREATE TABLE queueworker.run_events (
    id bigint NOT NULL,
    run_id bigint NOT NULL,
    from_state queueworker.run_state,
    to_state queueworker.run_state NOT NULL,
    detail jsonb NOT NULL,
    by_user text DEFAULT SESSION_USER NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE queueworker.run_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME queueworker.run_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE queueworker.runs (
    id bigint NOT NULL,
    name text NOT NULL,
    state queueworker.run_state DEFAULT 'running'::queueworker.run_state NOT NULL,
    expected integer NOT NULL,
    succeeded integer DEFAULT 0 NOT NULL,
    failed integer DEFAULT 0 NOT NULL,
    cancelled integer DEFAULT 0 NOT NULL,
    on_success jsonb,
    on_failure jsonb,
    success_task_id bigint,
    failure_task_id bigint,
    forced boolean DEFAULT false NOT NULL,
    watermark text,
    watermark_before jsonb,
    watermark_after jsonb,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    queues text[],
    CONSTRAINT outcomes_bounded CHECK ((((succeeded + failed) + cancelled) <= expected)),
    CONSTRAINT runs_cancelled_check CHECK ((cancelled >= 0)),
    CONSTRAINT runs_expected_check CHECK ((expected >= 1)),
    CONSTRAINT runs_failed_check CHECK ((failed >= 0)),
    CONSTRAINT runs_name_check CHECK (((length(name) >= 1) AND (length(name) <= 200))),
    CONSTRAINT runs_succeeded_check CHECK ((succeeded >= 0))
);

ALTER TABLE queueworker.runs ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME queueworker.runs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE queueworker.schema_functions (
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE queueworker.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE queueworker.task_dependencies (
    prerequisite_id bigint NOT NULL,
    task_id bigint NOT NULL,
    cancel_on_failure boolean NOT NULL,
    counted text,
    CONSTRAINT counted_as CHECK ((counted = ANY (ARRAY['waiting'::text, 'done'::text, 'failed'::text]))),
    CONSTRAINT prerequisite_first CHECK ((prerequisite_id < task_id))
);

CREATE TABLE queueworker.task_events (
    id bigint NOT NULL,
    task_id bigint NOT NULL,
    from_state queueworker.task_state,
    to_state queueworker.task_state NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    worker uuid,
    lease_token bigint NOT NULL,
    detail jsonb,
    by_user text DEFAULT SESSION_USER
)
WITH (autovacuum_vacuum_insert_scale_factor='0.05');

ALTER TABLE queueworker.task_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME queueworker.task_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE queueworker.tasks_active (
    id bigint NOT NULL,
    queue text DEFAULT 'default'::text NOT NULL,
    task text NOT NULL,
    state queueworker.task_state DEFAULT 'pending'::queueworker.task_state NOT NULL,
    delayed boolean DEFAULT true NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    run_after timestamp with time zone DEFAULT now() NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 10 NOT NULL,
    rescues integer DEFAULT 0 NOT NULL,
    timeout_seconds integer,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    result jsonb,
    error jsonb,
    lease_owner uuid,
    lease_token bigint DEFAULT 0 NOT NULL,
    leased_until timestamp with time zone,
    deadline_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    spec_hash bytea NOT NULL,
    dedupe_key text,
    run_id bigint,
    run_partition integer,
    progress jsonb,
    checkpoint jsonb,
    continued_from bigint,
    notify_on_finish boolean DEFAULT false NOT NULL,
    headers jsonb,
    prerequisites_waiting integer DEFAULT 0 NOT NULL,
    prerequisites_failed integer DEFAULT 0 NOT NULL,
    key text,
    fair_tag double precision,
    CONSTRAINT dedupe_key_length CHECK (((length(dedupe_key) >= 1) AND (length(dedupe_key) <= 512))),
    CONSTRAINT run_after_readable CHECK (((run_after >= '0002-01-01 00:00:00+00'::timestamp with time zone) AND (run_after <= '9999-12-30 00:00:00+00'::timestamp with time zone))),
    CONSTRAINT running_has_lease CHECK (((state <> 'running'::queueworker.task_state) OR ((lease_owner IS NOT NULL) AND (leased_until IS NOT NULL) AND (deadline_at IS NOT NULL)))),
    CONSTRAINT tasks_attempts_check1 CHECK ((attempts >= 0)),
    CONSTRAINT tasks_max_attempts_check1 CHECK ((max_attempts >= 1)),
    CONSTRAINT tasks_queue_check1 CHECK ((queue ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'::text)),
    CONSTRAINT tasks_task_check1 CHECK (((length(task) >= 1) AND (length(task) <= 200))),
    CONSTRAINT tasks_timeout_seconds_check1 CHECK ((timeout_seconds > 0))
)
WITH (fillfactor='80', autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_insert_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02', autovacuum_vacuum_cost_delay='1');

CREATE TABLE queueworker.tasks_finished (
    id bigint NOT NULL,
    queue text DEFAULT 'default'::text NOT NULL,
    task text NOT NULL,
    state queueworker.task_state DEFAULT 'pending'::queueworker.task_state NOT NULL,
    delayed boolean DEFAULT true NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    run_after timestamp with time zone DEFAULT now() NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 10 NOT NULL,
    rescues integer DEFAULT 0 NOT NULL,
    timeout_seconds integer,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    result jsonb,
    error jsonb,
    lease_owner uuid,
    lease_token bigint DEFAULT 0 NOT NULL,
    leased_until timestamp with time zone,
    deadline_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    spec_hash bytea NOT NULL,
    dedupe_key text,
    run_id bigint,
    run_partition integer,
    progress jsonb,
    checkpoint jsonb,
    continued_from bigint,
    notify_on_finish boolean DEFAULT false NOT NULL,
    headers jsonb,
    prerequisites_waiting integer DEFAULT 0 NOT NULL,
    prerequisites_failed integer DEFAULT 0 NOT NULL,
    key text,
    fair_tag double precision,
    CONSTRAINT dedupe_key_length CHECK (((length(dedupe_key) >= 1) AND (length(dedupe_key) <= 512))),
    CONSTRAINT run_after_readable CHECK (((run_after >= '0002-01-01 00:00:00+00'::timestamp with time zone) AND (run_after <= '9999-12-30 00:00:00+00'::timestamp with time zone))),
    CONSTRAINT running_has_lease CHECK (((state <> 'running'::queueworker.task_state) OR ((lease_owner IS NOT NULL) AND (leased_until IS NOT NULL) AND (deadline_at IS NOT NULL)))),
    CONSTRAINT tasks_attempts_check1 CHECK ((attempts >= 0)),
    CONSTRAINT tasks_max_attempts_check1 CHECK ((max_attempts >= 1)),
    CONSTRAINT tasks_queue_check1 CHECK ((queue ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'::text)),
    CONSTRAINT tasks_task_check1 CHECK (((length(task) >= 1) AND (length(task) <= 200))),
    CONSTRAINT tasks_timeout_seconds_check1 CHECK ((timeout_seconds > 0))
)
WITH (autovacuum_vacuum_cost_delay='1');

ALTER TABLE queueworker.tasks ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME queueworker.tasks_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE queueworker.watermarks (
    name text NOT NULL,
    value jsonb NOT NULL,
    run_id bigint,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    queues text[]
);

CREATE TABLE queueworker.workers (
    id uuid NOT NULL,
    hostname text NOT NULL,
    pod_name text,
    pod_namespace text,
    pid integer NOT NULL,
    queues text[] NOT NULL,
    concurrency integer NOT NULL,
    running integer DEFAULT 0 NOT NULL,
    draining boolean DEFAULT false NOT NULL,
    version text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT workers_queues_pattern CHECK (((array_position(queues, NULL::text) IS NULL) AND ((cardinality(queues) = 0) OR (array_to_string(queues, ' '::text) ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}( [A-Za-z0-9][A-Za-z0-9_.:-]{0,127})*$'::text))))
)
WITH (fillfactor='50');

ALTER TABLE ONLY queueworker.tasks ATTACH PARTITION queueworker.tasks_active FOR VALUES IN ('pending', 'running', 'retrying', 'blocked');

ALTER TABLE ONLY queueworker.tasks ATTACH PARTITION queueworker.tasks_finished FOR VALUES IN ('succeeded', 'failed', 'cancelled');

ALTER TABLE ONLY queueworker.cron_jobs
    ADD CONSTRAINT cron_jobs_pkey PRIMARY KEY (name);

ALTER TABLE ONLY queueworker.duty_locks
    ADD CONSTRAINT duty_locks_pkey PRIMARY KEY (duty);

ALTER TABLE ONLY queueworker.queue_events
    ADD CONSTRAINT queue_events_pkey PRIMARY KEY (id);

ALTER TABLE queueworker.queue_events
    ADD CONSTRAINT queue_events_queue_pattern CHECK ((queue ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'::text)) NOT VALID;

ALTER TABLE ONLY queueworker.queue_grants
    ADD CONSTRAINT queue_grants_pkey PRIMARY KEY (grantee, pattern);

ALTER TABLE ONLY queueworker.queue_keys
    ADD CONSTRAINT queue_keys_pkey PRIMARY KEY (queue, key);

ALTER TABLE ONLY queueworker.queues
    ADD CONSTRAINT queues_pkey PRIMARY KEY (name);

ALTER TABLE ONLY queueworker.run_events
    ADD CONSTRAINT run_events_pkey PRIMARY KEY (id);

ALTER TABLE ONLY queueworker.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY queueworker.schema_functions
    ADD CONSTRAINT schema_functions_pkey PRIMARY KEY (name);

ALTER TABLE ONLY queueworker.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY queueworker.task_dependencies
    ADD CONSTRAINT task_dependencies_pkey PRIMARY KEY (prerequisite_id, task_id);

ALTER TABLE ONLY queueworker.task_events
    ADD CONSTRAINT task_events_pkey PRIMARY KEY (id);

ALTER TABLE ONLY queueworker.tasks
    ADD CONSTRAINT tasks_pkey PRIMARY KEY (id, state);

ALTER TABLE ONLY queueworker.tasks_active
    ADD CONSTRAINT tasks_active_pkey PRIMARY KEY (id, state);

ALTER TABLE ONLY queueworker.tasks_finished
    ADD CONSTRAINT tasks_finished_pkey PRIMARY KEY (id, state);

ALTER TABLE queueworker.tasks
    ADD CONSTRAINT tasks_key_text CHECK (((key IS NULL) OR (((length(key) >= 1) AND (length(key) <= 256)) AND (key !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]'::text)))) NOT VALID;

ALTER TABLE ONLY queueworker.watermarks
    ADD CONSTRAINT watermarks_pkey PRIMARY KEY (name);

ALTER TABLE ONLY queueworker.workers
    ADD CONSTRAINT workers_pkey PRIMARY KEY (id);

CREATE INDEX cron_jobs_due ON queueworker.cron_jobs USING btree (next_slot) WHERE (NOT paused);

CREATE INDEX queue_events_at ON queueworker.queue_events USING btree (at);

CREATE INDEX queue_events_queue ON queueworker.queue_events USING btree (queue, id);

CREATE INDEX queues_keyed ON queueworker.queues USING btree (name) WHERE keyed;

CREATE INDEX run_events_at ON queueworker.run_events USING btree (at);

CREATE INDEX run_events_run ON queueworker.run_events USING btree (run_id, id);

CREATE INDEX runs_name ON queueworker.runs USING btree (name, id DESC);

CREATE INDEX runs_running ON queueworker.runs USING btree (id) WHERE (state = 'running'::queueworker.run_state);

CREATE INDEX runs_started ON queueworker.runs USING btree (started_at);

CREATE INDEX runs_watermark ON queueworker.runs USING btree (watermark, id DESC) WHERE (watermark IS NOT NULL);

CREATE INDEX task_dependencies_failed ON queueworker.task_dependencies USING btree (task_id, prerequisite_id) WHERE (counted = 'failed'::text);

CREATE INDEX task_dependencies_task ON queueworker.task_dependencies USING btree (task_id);

CREATE INDEX task_dependencies_uncounted ON queueworker.task_dependencies USING btree (task_id) WHERE (counted IS NULL);

CREATE INDEX task_events_task ON queueworker.task_events USING btree (task_id, id);

CREATE INDEX tasks_run ON ONLY queueworker.tasks USING btree (run_id, run_partition) WHERE (run_id IS NOT NULL);

CREATE INDEX tasks_active_run_id_run_partition_idx ON queueworker.tasks_active USING btree (run_id, run_partition) WHERE (run_id IS NOT NULL);

CREATE INDEX tasks_blocked ON queueworker.tasks_active USING btree (queue) WHERE (state = 'blocked'::queueworker.task_state);

CREATE INDEX tasks_claim ON queueworker.tasks_active USING btree (queue, priority DESC, run_after, id) WHERE ((state = 'pending'::queueworker.task_state) AND (NOT delayed));

CREATE UNIQUE INDEX tasks_dedupe ON queueworker.tasks_active USING btree (queue, dedupe_key) WHERE (dedupe_key IS NOT NULL);

CREATE INDEX tasks_fair ON queueworker.tasks_active USING btree (queue, priority DESC, fair_tag, id) WHERE ((state = 'pending'::queueworker.task_state) AND (NOT delayed) AND (fair_tag IS NOT NULL));

CREATE INDEX tasks_fair_key ON queueworker.tasks_active USING btree (queue, key, priority, fair_tag) WHERE ((state = 'pending'::queueworker.task_state) AND (NOT delayed) AND (fair_tag IS NOT NULL));

CREATE INDEX tasks_finished_at ON queueworker.tasks_finished USING btree (finished_at);

CREATE INDEX tasks_finished_run_id_run_partition_idx ON queueworker.tasks_finished USING btree (run_id, run_partition) WHERE (run_id IS NOT NULL);

CREATE INDEX tasks_running ON queueworker.tasks_active USING btree (queue, lease_owner) WHERE (state = 'running'::queueworker.task_state);

CREATE INDEX tasks_spec_hash ON queueworker.tasks_finished USING btree (spec_hash);

CREATE INDEX tasks_waiting ON queueworker.tasks_active USING btree (run_after) WHERE ((state = 'retrying'::queueworker.task_state) OR ((state = 'pending'::queueworker.task_state) AND delayed));

ALTER INDEX queueworker.tasks_pkey ATTACH PARTITION queueworker.tasks_active_pkey;

ALTER INDEX queueworker.tasks_run ATTACH PARTITION queueworker.tasks_active_run_id_run_partition_idx;

ALTER INDEX queueworker.tasks_pkey ATTACH PARTITION queueworker.tasks_finished_pkey;

ALTER INDEX queueworker.tasks_run ATTACH PARTITION queueworker.tasks_finished_run_id_run_partition_idx;

CREATE TRIGGER queue_events_append_only BEFORE UPDATE ON queueworker.queue_events FOR EACH ROW EXECUTE FUNCTION queueworker.forbid_event_updates();

CREATE TRIGGER queue_events_no_truncate BEFORE TRUNCATE ON queueworker.queue_events FOR EACH STATEMENT EXECUTE FUNCTION queueworker.forbid_event_updates();

CREATE TRIGGER queue_keys_audit AFTER INSERT OR DELETE OR UPDATE ON queueworker.queue_keys FOR EACH ROW EXECUTE FUNCTION queueworker.audit_queue_key();

CREATE TRIGGER queues_audit_insert AFTER INSERT OR DELETE ON queueworker.queues FOR EACH ROW EXECUTE FUNCTION queueworker.audit_queue();

CREATE TRIGGER queues_audit_update AFTER UPDATE ON queueworker.queues FOR EACH ROW WHEN (((((((((old.paused_until IS DISTINCT FROM new.paused_until) OR (old.rate_per_second IS DISTINCT FROM new.rate_per_second)) OR (old.burst IS DISTINCT FROM new.burst)) OR (old.max_running IS DISTINCT FROM new.max_running)) OR (old.breaker_failures IS DISTINCT FROM new.breaker_failures)) OR (old.breaker_cooldown_seconds IS DISTINCT FROM new.breaker_cooldown_seconds)) OR (old.breaker_state IS DISTINCT FROM new.breaker_state)) OR ((NOT old.keyed) AND new.keyed))) EXECUTE FUNCTION queueworker.audit_queue();

CREATE TRIGGER run_events_append_only BEFORE UPDATE ON queueworker.run_events FOR EACH ROW EXECUTE FUNCTION queueworker.forbid_event_updates();

CREATE TRIGGER run_events_no_truncate BEFORE TRUNCATE ON queueworker.run_events FOR EACH STATEMENT EXECUTE FUNCTION queueworker.forbid_event_updates();

CREATE TRIGGER runs_audit_insert AFTER INSERT ON queueworker.runs FOR EACH ROW EXECUTE FUNCTION queueworker.audit_run();

CREATE TRIGGER runs_audit_update AFTER UPDATE ON queueworker.runs FOR EACH ROW WHEN (((old.state IS DISTINCT FROM new.state) OR (old.success_task_id IS DISTINCT FROM new.success_task_id) OR (old.failure_task_id IS DISTINCT FROM new.failure_task_id))) EXECUTE FUNCTION queueworker.audit_run();

CREATE TRIGGER task_events_append_only BEFORE UPDATE ON queueworker.task_events FOR EACH ROW EXECUTE FUNCTION queueworker.forbid_event_updates();

CREATE TRIGGER task_events_no_truncate BEFORE TRUNCATE ON queueworker.task_events FOR EACH STATEMENT EXECUTE FUNCTION queueworker.forbid_event_updates();

CREATE TRIGGER tasks_active_audit_insert AFTER INSERT ON queueworker.tasks_active REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION queueworker.audit_task_inserts();

CREATE TRIGGER tasks_active_fair_tag_insert AFTER INSERT ON queueworker.tasks_active REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION queueworker.fair_tag_inserts();

CREATE CONSTRAINT TRIGGER tasks_active_settle_new_dependent AFTER INSERT ON queueworker.tasks_active DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ((new.state = 'blocked'::queueworker.task_state)) EXECUTE FUNCTION queueworker.settle_new_dependent();

CREATE TRIGGER tasks_active_spec_changed BEFORE UPDATE OF queue, task, payload ON queueworker.tasks_active FOR EACH ROW EXECUTE FUNCTION queueworker.fill_spec_hash();

CREATE TRIGGER tasks_active_spec_hash BEFORE INSERT ON queueworker.tasks_active FOR EACH ROW WHEN ((new.spec_hash IS NULL)) EXECUTE FUNCTION queueworker.fill_spec_hash();

CREATE TRIGGER tasks_audit_insert AFTER INSERT ON queueworker.tasks REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION queueworker.audit_task_inserts();

CREATE TRIGGER tasks_audit_update AFTER UPDATE ON queueworker.tasks REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION queueworker.audit_task_updates();

CREATE TRIGGER tasks_fair_tag_insert AFTER INSERT ON queueworker.tasks REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION queueworker.fair_tag_inserts();

CREATE TRIGGER tasks_fair_tag_update AFTER UPDATE ON queueworker.tasks REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION queueworker.fair_tag_updates();

CREATE TRIGGER tasks_finished_spec_hash BEFORE INSERT ON queueworker.tasks_finished FOR EACH ROW WHEN ((new.spec_hash IS NULL)) EXECUTE FUNCTION queueworker.fill_spec_hash();

CREATE TRIGGER tasks_notify_finished AFTER UPDATE ON queueworker.tasks REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION queueworker.notify_finished();

REVOKE ALL ON FUNCTION queueworker.audit_queue() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.audit_queue_key() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.audit_run() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.clean_finished(retention_seconds double precision, batch integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.clean_finished(lock_key bigint, retention_seconds double precision, batch integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.clean_queue_events(retention_seconds double precision, batch integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.clean_runs(retention_seconds double precision, batch integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.clean_watermarks(retention_seconds double precision, batch integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.count_run_outcomes(ids bigint[], run_ids bigint[], partitions integer[], old_states text[], new_states text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.enqueue_tasks(queues text[], tasks text[], payloads jsonb[], priorities integer[], run_afters timestamp with time zone[], max_attempts integer[], timeouts integer[], dedupe_keys text[], by_spec boolean[], cancel_on_failure boolean[], prerequisite_ords bigint[], prerequisite_ids bigint[], run_ids bigint[], run_partitions integer[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.enqueue_tasks(queues text[], tasks text[], payloads jsonb[], priorities integer[], run_afters timestamp with time zone[], max_attempts integer[], timeouts integer[], dedupe_keys text[], by_spec boolean[], cancel_on_failure boolean[], prerequisite_ords bigint[], prerequisite_ids bigint[], run_ids bigint[], run_partitions integer[], headers jsonb[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.enqueue_tasks(queues text[], tasks text[], payloads jsonb[], priorities integer[], run_afters timestamp with time zone[], max_attempts integer[], timeouts integer[], dedupe_keys text[], by_spec boolean[], cancel_on_failure boolean[], prerequisite_ords bigint[], prerequisite_ids bigint[], run_ids bigint[], run_partitions integer[], headers jsonb[], keys text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.existing_tasks(ords bigint[], queues text[], dedupe_keys text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.fair_tag_inserts() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.fair_tag_updates() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.finalize_run(run_id bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.grant_queue(grantee text, pattern text) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.mark_notify_on_finish(ids bigint[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.notify_finished() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.queue_patterns() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.replace_pending(ids bigint[], payloads jsonb[], priorities integer[], run_afters timestamp with time zone[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.require_queues(queues text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.retention_cutoff(retention_seconds double precision, batch integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.revoke_queue(grantee text, pattern text) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.settle_dependents(prerequisites bigint[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.settle_dependents(prerequisites bigint[], succeeded bigint[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.start_run(name text, expected integer, on_success jsonb, on_failure jsonb, watermark text) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.start_run(name text, expected integer, on_success jsonb, on_failure jsonb, watermark text, queues text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.tag_fair(ids bigint[], stale bigint[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.unbound_by_grants() FROM PUBLIC;
