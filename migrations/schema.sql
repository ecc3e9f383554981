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

CREATE FUNCTION queueworker.audit_key_breaker() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO queueworker.queue_events (queue, change, detail)
    VALUES (NEW.queue, 'key_breaker_' || NEW.breaker_state,
            jsonb_build_object('key', NEW.key, 'breaker_state', NEW.breaker_state,
                               'failure_streak', NEW.failure_streak));
    RETURN NULL;
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
    IF TG_OP = 'INSERT' AND NOT NEW.keyed
       AND num_nonnulls(NEW.paused_until, NEW.rate_per_second, NEW.max_running, NEW.breaker_failures,
                        NEW.key_rate_per_second, NEW.key_max_running, NEW.key_breaker_failures) = 0 THEN
        RETURN NULL;  -- made for a key's own limit (76_key_limits.sql): queue_keys' audit has it
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
        'consecutive_failures', NEW.consecutive_failures, 'keyed', NULLIF(NEW.keyed, false),
        'key_rate_per_second', NEW.key_rate_per_second, 'key_burst', NEW.key_burst,
        'key_max_running', NEW.key_max_running, 'key_breaker_failures', NEW.key_breaker_failures,
        'key_breaker_cooldown_seconds', NEW.key_breaker_cooldown_seconds)));
    RETURN NULL;
END
$$;

CREATE FUNCTION queueworker.audit_queue_key() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    change text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO queueworker.queue_events (queue, change, detail)
        VALUES (OLD.queue,
                CASE WHEN num_nonnulls(OLD.weight, OLD.rate_per_second, OLD.max_running) = 0
                     THEN 'key_resumed' ELSE 'key_cleared' END,
                jsonb_build_object('key', OLD.key));
        RETURN NULL;
    END IF;
    change := CASE
        WHEN TG_OP = 'UPDATE' AND OLD.paused_until IS NOT NULL AND NEW.paused_until IS NULL THEN 'key_resumed'
        WHEN NEW.paused_until IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.paused_until IS DISTINCT FROM NEW.paused_until)
            THEN 'key_paused'
        WHEN TG_OP = 'INSERT' AND num_nonnulls(NEW.rate_per_second, NEW.max_running) = 0 THEN 'key_weight'
        WHEN TG_OP = 'UPDATE' AND (OLD.rate_per_second, OLD.burst, OLD.max_running)
                                  IS NOT DISTINCT FROM (NEW.rate_per_second, NEW.burst, NEW.max_running)
            THEN 'key_weight'
        ELSE 'key_limits' END;
    INSERT INTO queueworker.queue_events (queue, change, detail)
    VALUES (NEW.queue, change, jsonb_strip_nulls(jsonb_build_object(
        'key', NEW.key, 'weight', NEW.weight, 'rate_per_second', NEW.rate_per_second, 'burst', NEW.burst,
        'max_running', NEW.max_running, 'paused_until', NEW.paused_until)));
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
    nestloop text := current_setting('enable_nestloop');
    moved bigint[];
    ids bigint[];
    run_ids bigint[];
    partitions integer[];
    old_states text[];
    new_states text[];
BEGIN
    PERFORM set_config('enable_nestloop', 'off', true);
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT n.id, o.state, n.state, coalesce(o.lease_owner, n.lease_owner), n.lease_token,
           CASE WHEN n.state IS DISTINCT FROM o.state
                THEN queueworker.transition_detail(n.attempts, n.error, o.error)
                ELSE jsonb_build_object('replaced', queueworker.replaced_columns(n, o)) END
    FROM new_rows n
    JOIN old_rows o ON o.id = n.id
    WHERE n.state IS DISTINCT FROM o.state
       OR (n.state = 'pending' AND queueworker.replaced_columns(n, o) IS NOT NULL);
    SELECT array_agg(n.id), array_agg(n.run_id), array_agg(n.run_partition), array_agg(o.state::text),
           array_agg(n.state::text)
    INTO ids, run_ids, partitions, old_states, new_states
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.run_id IS NOT NULL AND n.state IS DISTINCT FROM o.state;
    IF coalesce(current_setting('queueworker.settling', true), '') <> 'on' THEN
        SELECT array_agg(n.id) INTO moved
        FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE n.state IS DISTINCT FROM o.state
          AND (n.state IN ('succeeded', 'failed', 'cancelled') OR o.state IN ('failed', 'cancelled'));
    END IF;
    PERFORM set_config('enable_nestloop', nestloop, true);
    IF ids IS NOT NULL THEN
        PERFORM queueworker.count_run_outcomes(ids, run_ids, partitions, old_states, new_states);
    END IF;
    IF moved IS NOT NULL THEN
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

CREATE FUNCTION queueworker.claim_fair_tasks(queue_name text, claim_limit integer, worker_id uuid, lease_seconds double precision, default_timeout_seconds double precision, commit_without_waiting boolean) RETURNS TABLE(id bigint, queue text, task text, payload_json text, attempts integer, max_attempts integer, lease_token bigint, seconds_to_deadline double precision, run_json text, checkpoint_json text, headers_json text, key text)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $_$
#variable_conflict use_column
BEGIN
    IF commit_without_waiting THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY
    WITH fair AS MATERIALIZED (
        SELECT id, priority, fair_tag FROM queueworker.tasks_active
        WHERE state = 'pending' AND NOT delayed AND fair_tag IS NOT NULL AND queue = $1 AND run_after <= now()
          AND NOT EXISTS (SELECT FROM queueworker.queues l WHERE l.name = $1 AND l.limited)
        ORDER BY priority DESC, fair_tag, id
        LIMIT $2
        FOR NO KEY UPDATE SKIP LOCKED
    ), untagged AS MATERIALIZED (
        SELECT id FROM queueworker.tasks_active
        WHERE state = 'pending' AND NOT delayed AND queue = $1 AND run_after <= now() AND fair_tag IS NULL
          AND NOT EXISTS (SELECT FROM queueworker.queues l WHERE l.name = $1 AND l.limited)
        ORDER BY priority DESC, run_after, id
        LIMIT $2 - (SELECT count(*) FROM fair)
        FOR NO KEY UPDATE SKIP LOCKED
    ), picked AS (
        SELECT id FROM fair UNION ALL SELECT id FROM untagged
    ), claimed AS (
        UPDATE queueworker.tasks_active t
        SET state = 'running', attempts = t.attempts + 1, lease_owner = $3,
            lease_token = t.lease_token + 1, fair_tag = -coalesce(t.fair_tag, 1),
            leased_until = statement_timestamp() + make_interval(secs => $4),
            deadline_at = statement_timestamp() + make_interval(secs => coalesce(t.timeout_seconds, $5)),
            started_at = statement_timestamp(), updated_at = statement_timestamp()
        WHERE t.id = ANY(ARRAY(SELECT id FROM picked)) AND t.state = 'pending'
        RETURNING t.id, t.queue, t.task, t.payload::text AS payload_json, t.attempts, t.max_attempts, t.lease_token,
                  extract(epoch FROM t.deadline_at - statement_timestamp())::float8 AS seconds_to_deadline,
                  CASE WHEN t.run_id IS NOT NULL THEN (
                      SELECT jsonb_build_object('id', r.id, 'name', r.name, 'partition', t.run_partition,
                                                'watermark', r.watermark, 'watermark_before', r.watermark_before,
                                                'forced', r.forced)::text
                      FROM queueworker.runs r WHERE r.id = t.run_id) END AS run_json,
                  t.checkpoint::text AS checkpoint_json, t.headers::text AS headers_json, t.key
    ), audited AS (
        INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
        SELECT id, 'pending', 'running', $3, lease_token, jsonb_build_object('attempts', attempts)
        FROM claimed
    )
    SELECT id, queue, task, payload_json, attempts, max_attempts, lease_token, seconds_to_deadline, run_json,
           checkpoint_json, headers_json, key
    FROM claimed;
END
$_$;

CREATE FUNCTION queueworker.claim_tasks(queue_name text, claim_limit integer, worker_id uuid, lease_seconds double precision, default_timeout_seconds double precision, commit_without_waiting boolean) RETURNS TABLE(id bigint, queue text, task text, payload_json text, attempts integer, max_attempts integer, lease_token bigint, seconds_to_deadline double precision, run_json text, checkpoint_json text, headers_json text, key text)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $_$
#variable_conflict use_column
BEGIN
    IF commit_without_waiting THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT id, priority, run_after FROM queueworker.tasks_active
        WHERE state = 'pending' AND NOT delayed AND queue = $1 AND run_after <= now()
          AND NOT EXISTS (SELECT FROM queueworker.queues l WHERE l.name = $1 AND (l.limited OR l.keyed))
        ORDER BY priority DESC, run_after, id
        LIMIT $2
        FOR NO KEY UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE queueworker.tasks_active t
        SET state = 'running', attempts = t.attempts + 1, lease_owner = $3,
            lease_token = t.lease_token + 1,
            leased_until = statement_timestamp() + make_interval(secs => $4),
            deadline_at = statement_timestamp() + make_interval(secs => coalesce(t.timeout_seconds, $5)),
            started_at = statement_timestamp(), updated_at = statement_timestamp()
        WHERE t.id = ANY(ARRAY(SELECT id FROM picked)) AND t.state = 'pending'
        RETURNING t.id, t.queue, t.task, t.payload::text AS payload_json, t.attempts, t.max_attempts, t.lease_token,
                  extract(epoch FROM t.deadline_at - statement_timestamp())::float8 AS seconds_to_deadline,
                  CASE WHEN t.run_id IS NOT NULL THEN (
                      SELECT jsonb_build_object('id', r.id, 'name', r.name, 'partition', t.run_partition,
                                                'watermark', r.watermark, 'watermark_before', r.watermark_before,
                                                'forced', r.forced)::text
                      FROM queueworker.runs r WHERE r.id = t.run_id) END AS run_json,
                  t.checkpoint::text AS checkpoint_json, t.headers::text AS headers_json, t.key
    ), audited AS (
        INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
        SELECT id, 'pending', 'running', $3, lease_token, jsonb_build_object('attempts', attempts)
        FROM claimed
    )
    SELECT id, queue, task, payload_json, attempts, max_attempts, lease_token, seconds_to_deadline, run_json,
           checkpoint_json, headers_json, key
    FROM claimed;
END
$_$;

CREATE FUNCTION queueworker.clean_finished(retention_seconds double precision, batch integer) RETURNS SETOF bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
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

CREATE FUNCTION queueworker.clean_key_state(retention_seconds double precision, batch integer) RETURNS SETOF text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    cutoff timestamptz := queueworker.retention_cutoff(retention_seconds, batch);
BEGIN
    PERFORM FROM queueworker.duty_locks WHERE duty = 'clean_key_state' FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH idle AS (
        SELECT b.queue, b.key FROM queueworker.key_state b
        WHERE b.active_minute < cutoff  -- the minute starts at or before the activity it holds
          AND coalesce(greatest(b.tokens_at, b.breaker_changed_at, b.last_success_at, b.last_failure_at),
                       '-infinity'::timestamptz) < cutoff
          AND b.key <> ''
          AND NOT EXISTS (SELECT FROM queueworker.tasks_active t WHERE t.queue = b.queue AND t.key = b.key)
          AND (b.tokens IS NULL OR NOT EXISTS (
                  SELECT FROM queueworker.queues q
                  LEFT JOIN queueworker.queue_keys k ON k.queue = q.name AND k.key = b.key
                  WHERE q.name = b.queue
                    AND coalesce(k.rate_per_second, q.key_rate_per_second) IS NOT NULL
                    AND b.tokens + coalesce(k.rate_per_second, q.key_rate_per_second)
                                   * extract(epoch FROM now() - b.tokens_at)
                        < CASE WHEN k.rate_per_second IS NOT NULL THEN k.burst ELSE q.key_burst END))
          AND (b.breaker_state = 'closed' OR NOT EXISTS (
                  SELECT FROM queueworker.queues q
                  WHERE q.name = b.queue AND q.key_breaker_cooldown_seconds IS NOT NULL
                    AND now() < b.breaker_changed_at + make_interval(secs => q.key_breaker_cooldown_seconds)))
        ORDER BY b.active_minute
        LIMIT batch
        FOR UPDATE OF b SKIP LOCKED
    )
    DELETE FROM queueworker.key_state b USING idle
    WHERE b.queue = idle.queue AND b.key = idle.key
    RETURNING b.queue;
END
$$;

CREATE FUNCTION queueworker.clean_queue_events(retention_seconds double precision, batch integer) RETURNS SETOF bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
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
    SET enable_seqscan TO 'off'
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
    SET enable_seqscan TO 'off'
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
    SET enable_seqscan TO 'off'
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

CREATE FUNCTION queueworker.enqueue(task text, payload jsonb DEFAULT '{}'::jsonb, queue text DEFAULT 'default'::text, priority bigint DEFAULT 0, run_after timestamp with time zone DEFAULT NULL::timestamp with time zone, delay double precision DEFAULT NULL::double precision, max_attempts bigint DEFAULT 10, timeout_seconds bigint DEFAULT NULL::bigint, dedupe_key text DEFAULT NULL::text, dedupe text DEFAULT NULL::text, on_conflict text DEFAULT 'ignore'::text, key text DEFAULT NULL::text, depends_on bigint[] DEFAULT '{}'::bigint[], on_dependency_failure text DEFAULT 'cancel'::text, headers jsonb DEFAULT NULL::jsonb, notify_on_finish boolean DEFAULT false) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    given_payload jsonb := coalesce(payload, '{}');
    given_headers jsonb := nullif(headers, 'null');
    problem text := queueworker.task_spec_problem(task, given_payload, queue, priority, run_after, delay, max_attempts,
                                                  timeout_seconds, dedupe_key, dedupe, on_conflict, key, depends_on,
                                                  on_dependency_failure, given_headers, notify_on_finish);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'queueworker.enqueue: %', problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN (queueworker.enqueue_checked_specs(
        ARRAY[queue], ARRAY[task], ARRAY[given_payload], ARRAY[priority::integer],
        ARRAY[CASE WHEN delay > 0 THEN now() + delay * interval '1 second' ELSE run_after END],
        ARRAY[max_attempts::integer], ARRAY[timeout_seconds::integer], ARRAY[dedupe_key], ARRAY[dedupe IS NOT NULL],
        ARRAY[on_dependency_failure = 'cancel'], array_fill(1::bigint, ARRAY[cardinality(depends_on)]), depends_on,
        ARRAY[given_headers], ARRAY[key], ARRAY[on_conflict = 'replace'], ARRAY[notify_on_finish]))[1];
END
$$;

CREATE FUNCTION queueworker.enqueue_checked_specs(queues text[], tasks text[], payloads jsonb[], priorities integer[], run_afters timestamp with time zone[], max_attempts integer[], timeouts integer[], dedupe_keys text[], by_spec boolean[], cancel_on_failure boolean[], prerequisite_ords bigint[], prerequisite_ids bigint[], headers jsonb[], keys text[], replace_duplicates boolean[], notify boolean[]) RETURNS bigint[]
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    spec_count integer := coalesce(cardinality(tasks), 0);
    ids bigint[] := array_fill(NULL::bigint, ARRAY[spec_count]);
    duplicate boolean[] := array_fill(false, ARRAY[spec_count]);
    -- A round's specs: their positions in the arguments (`todo`), and their values (every spec's, in
    -- the first round; later rounds are rare, and take only the specs left).
    todo bigint[] := ARRAY(SELECT generate_series(1, spec_count)::bigint);
    round_queues text[] := queues;
    round_tasks text[] := tasks;
    round_payloads jsonb[] := payloads;
    round_priorities integer[] := priorities;
    round_run_afters timestamptz[] := run_afters;
    round_attempts integer[] := max_attempts;
    round_timeouts integer[] := timeouts;
    round_dedupe_keys text[] := dedupe_keys;
    round_by_spec boolean[] := by_spec;
    round_cancel boolean[] := cancel_on_failure;
    round_edge_ords bigint[] := prerequisite_ords;
    round_edge_ids bigint[] := prerequisite_ids;
    round_headers jsonb[] := headers;
    round_keys text[] := keys;
    missing bigint[];  -- positions in the round of the specs whose key another task held
    missing_queues text[];
    missing_keys text[];
    inserted record;
    found_task record;
    replacing bigint[];
    rounds integer := 0;
BEGIN
    WHILE cardinality(todo) > 0 AND rounds < 3 LOOP
        rounds := rounds + 1;
        missing := '{}';
        missing_queues := '{}';
        missing_keys := '{}';
        FOR inserted IN
            SELECT e.ord, e.queue, e.dedupe_key, e.id FROM queueworker.enqueue_tasks(
                round_queues, round_tasks, round_payloads, round_priorities, round_run_afters, round_attempts,
                round_timeouts, round_dedupe_keys, round_by_spec, round_cancel, round_edge_ords, round_edge_ids,
                array_fill(NULL::bigint, ARRAY[cardinality(todo)]), array_fill(NULL::integer, ARRAY[cardinality(todo)]),
                round_headers, round_keys) AS e
            ORDER BY e.ord
        LOOP
            IF inserted.id IS NULL THEN
                missing := missing || inserted.ord;
                missing_queues := missing_queues || inserted.queue;
                missing_keys := missing_keys || inserted.dedupe_key;
            ELSE
                ids[todo[inserted.ord]] := inserted.id;
            END IF;
        END LOOP;
        IF cardinality(missing) = 0 THEN
            todo := '{}';
            EXIT;
        END IF;
        FOR found_task IN
            SELECT x.ord, x.id
            FROM queueworker.existing_tasks(ARRAY(SELECT todo[m.p] FROM unnest(missing) WITH ORDINALITY AS m(p, n)
                                                  ORDER BY m.n),
                                            missing_queues, missing_keys) AS x
        LOOP
            ids[found_task.ord] := found_task.id;
            duplicate[found_task.ord] := true;
        END LOOP;
        -- The next round: the specs whose key's holder finished and went in between.
        missing := ARRAY(SELECT m.p FROM unnest(missing) WITH ORDINALITY AS m(p, n) WHERE ids[todo[m.p]] IS NULL
                         ORDER BY m.n);
        SELECT array_agg(round_queues[m.p] ORDER BY m.n), array_agg(round_tasks[m.p] ORDER BY m.n),
               array_agg(round_payloads[m.p] ORDER BY m.n), array_agg(round_priorities[m.p] ORDER BY m.n),
               array_agg(round_run_afters[m.p] ORDER BY m.n), array_agg(round_attempts[m.p] ORDER BY m.n),
               array_agg(round_timeouts[m.p] ORDER BY m.n), array_agg(round_dedupe_keys[m.p] ORDER BY m.n),
               array_agg(round_by_spec[m.p] ORDER BY m.n), array_agg(round_cancel[m.p] ORDER BY m.n),
               array_agg(round_headers[m.p] ORDER BY m.n), array_agg(round_keys[m.p] ORDER BY m.n),
               coalesce(array_agg(todo[m.p] ORDER BY m.n), '{}')
        INTO round_queues, round_tasks, round_payloads, round_priorities, round_run_afters, round_attempts,
             round_timeouts, round_dedupe_keys, round_by_spec, round_cancel, round_headers, round_keys, todo
        FROM unnest(missing) WITH ORDINALITY AS m(p, n);
        -- Their edges, by their positions in the next round.
        SELECT coalesce(array_agg(m.n ORDER BY e.en), '{}'), coalesce(array_agg(e.prerequisite ORDER BY e.en), '{}')
        INTO round_edge_ords, round_edge_ids
        FROM unnest(round_edge_ords, round_edge_ids) WITH ORDINALITY AS e(o, prerequisite, en)
        JOIN unnest(missing) WITH ORDINALITY AS m(p, n) ON m.p = e.o;
    END LOOP;
    IF cardinality(todo) > 0 THEN
        RAISE EXCEPTION 'could not enqueue % unique tasks: their keys kept changing hands', cardinality(todo)
            USING ERRCODE = 'serialization_failure', HINT = 'run the transaction again';
    END IF;
    replacing := ARRAY(SELECT s.o FROM generate_series(1, spec_count) AS s(o) WHERE duplicate[s.o] AND replace_duplicates[s.o]
                       ORDER BY s.o);
    IF cardinality(replacing) > 0 THEN
        PERFORM queueworker.replace_pending(ARRAY(SELECT ids[r.o] FROM unnest(replacing) WITH ORDINALITY AS r(o, i) ORDER BY r.i),
                                            ARRAY(SELECT payloads[r.o] FROM unnest(replacing) WITH ORDINALITY AS r(o, i) ORDER BY r.i),
                                            ARRAY(SELECT priorities[r.o] FROM unnest(replacing) WITH ORDINALITY AS r(o, i) ORDER BY r.i),
                                            ARRAY(SELECT run_afters[r.o] FROM unnest(replacing) WITH ORDINALITY AS r(o, i) ORDER BY r.i));
    END IF;
    IF true = ANY(notify) THEN
        PERFORM queueworker.mark_notify_on_finish(ARRAY(SELECT ids[s.o] FROM generate_series(1, spec_count) AS s(o)
                                                        WHERE notify[s.o] ORDER BY s.o));
    END IF;
    RETURN ids;
END
$$;

CREATE FUNCTION queueworker.enqueue_many(specs jsonb) RETURNS bigint[]
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    fields text[] := ARRAY['task', 'payload', 'queue', 'priority', 'run_after', 'delay', 'max_attempts',
                           'timeout_seconds', 'dedupe_key', 'dedupe', 'on_conflict', 'key', 'depends_on',
                           'on_dependency_failure', 'headers', 'notify_on_finish'];
    spec jsonb;
    spec_position bigint;
    unknown text;
    delay_number numeric;
    problem text;
    task text; payload jsonb; queue text; priority bigint; run_after timestamptz; delay double precision;
    max_attempts bigint; timeout_seconds bigint; dedupe_key text; dedupe text; on_conflict text; key text;
    depends_on bigint[]; on_dependency_failure text; headers jsonb; notify_on_finish boolean;
    queues text[] := '{}'; tasks text[] := '{}'; payloads jsonb[] := '{}'; priorities integer[] := '{}';
    run_afters timestamptz[] := '{}'; attempts integer[] := '{}'; timeouts integer[] := '{}';
    dedupe_keys text[] := '{}'; by_spec boolean[] := '{}'; cancel_on_failure boolean[] := '{}';
    prerequisite_ords bigint[] := '{}'; prerequisite_ids bigint[] := '{}'; header_values jsonb[] := '{}';
    keys text[] := '{}'; replace boolean[] := '{}'; notify boolean[] := '{}';
    plain boolean;
BEGIN
    IF specs IS NULL OR jsonb_typeof(specs) <> 'array' THEN
        RAISE EXCEPTION 'queueworker.enqueue_many: specs must be a JSON array of objects'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A batch of plain specs (no run_after, dependencies or headers; every field of its type and
    -- within task_spec_problem's bounds, and no two that exclude each other) is checked and read in
    -- one statement: the loop below costs about 100 us per spec in calls (spec_field per field,
    -- task_spec_problem per spec), this about 10. Each check is the loop's own rule or a narrower
    -- one, so a spec this statement takes, the loop takes alike; anything else (a refusal included)
    -- goes through the loop, which names the first spec and field that is wrong. A value is cast
    -- only under the CASE that checked it: the statement itself never fails.
    SELECT coalesce(bool_and(c.ok), false), array_agg(c.queue ORDER BY c.n), array_agg(c.task ORDER BY c.n),
           array_agg(c.payload ORDER BY c.n),
           array_agg(CASE WHEN c.ok THEN coalesce((c.priority #>> '{}')::integer, 0) END ORDER BY c.n),
           array_agg(CASE WHEN c.ok THEN CASE WHEN (c.delay #>> '{}')::numeric > 0
                                              THEN now() + (c.delay #>> '{}')::numeric::float8 * interval '1 second' END
                     END ORDER BY c.n),
           array_agg(CASE WHEN c.ok THEN coalesce((c.max_attempts #>> '{}')::integer, 10) END ORDER BY c.n),
           array_agg(CASE WHEN c.ok THEN (c.timeout_seconds #>> '{}')::integer END ORDER BY c.n),
           array_agg(c.dedupe_key #>> '{}' ORDER BY c.n), array_agg(c.dedupe IS NOT NULL ORDER BY c.n),
           array_agg(c.on_dependency_failure IS DISTINCT FROM '"run"' ORDER BY c.n),
           array_agg(NULL::jsonb ORDER BY c.n), array_agg(c.key #>> '{}' ORDER BY c.n),
           array_agg(coalesce(c.on_conflict = '"replace"', false) ORDER BY c.n),
           array_agg(coalesce(c.notify_on_finish = 'true', false) ORDER BY c.n)
    INTO plain, queues, tasks, payloads, priorities, run_afters, attempts, timeouts, dedupe_keys, by_spec,
         cancel_on_failure, header_values, keys, replace, notify
    FROM (
        SELECT v.*, coalesce(v.queue_value #>> '{}', 'default') AS queue, v.task_value #>> '{}' AS task,
               coalesce(CASE WHEN jsonb_typeof(v.spec) = 'object' THEN (v.spec - fields) = '{}' ELSE false END
               AND jsonb_typeof(v.task_value) = 'string' AND length(v.task_value #>> '{}') BETWEEN 1 AND 200
               AND queueworker.printable_text(v.task_value #>> '{}') AND v.task_value #>> '{}' ~ '[^ ]'
               AND NOT jsonb_path_exists(v.payload, 'strict $.**{900} ? (@.type() == "object" || @.type() == "array")')
               AND NOT (length(v.payload::text) > 4300 AND EXISTS (
                   SELECT FROM jsonb_path_query(v.payload, 'strict $.** ? (@.type() == "number")') AS n(value)
                   WHERE n.value #>> '{}' !~ '[.eE]' AND length(ltrim(n.value #>> '{}', '-')) > 4300))
               AND (v.queue_value IS NULL OR jsonb_typeof(v.queue_value) = 'string'
                    AND v.queue_value #>> '{}' ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' AND length(v.queue_value #>> '{}') <= 128)
               AND (v.priority IS NULL OR CASE WHEN jsonb_typeof(v.priority) = 'number' AND v.priority::text ~ '^-?[0-9]{1,10}$'
                                               THEN v.priority::text::bigint BETWEEN -2147483648 AND 2147483647 ELSE false END)
               AND coalesce(jsonb_typeof(v.run_after), 'null') = 'null'
               AND (coalesce(jsonb_typeof(v.delay), 'null') = 'null'
                    OR CASE WHEN jsonb_typeof(v.delay) = 'number'
                            THEN v.delay::text::numeric = 0 OR v.delay::text::numeric BETWEEN 1e-300 AND 2147483647
                            ELSE false END)
               AND (v.max_attempts IS NULL OR CASE WHEN jsonb_typeof(v.max_attempts) = 'number' AND v.max_attempts::text ~ '^[0-9]{1,4}$'
                                                   THEN v.max_attempts::text::integer BETWEEN 1 AND 1000 ELSE false END)
               AND (coalesce(jsonb_typeof(v.timeout_seconds), 'null') = 'null'
                    OR CASE WHEN jsonb_typeof(v.timeout_seconds) = 'number' AND v.timeout_seconds::text ~ '^[0-9]{1,10}$'
                            THEN v.timeout_seconds::text::bigint BETWEEN 1 AND 2147483647 ELSE false END)
               AND (coalesce(jsonb_typeof(v.dedupe_key), 'null') = 'null'
                    OR jsonb_typeof(v.dedupe_key) = 'string' AND length(v.dedupe_key #>> '{}') BETWEEN 1 AND 512
                       AND queueworker.printable_text(v.dedupe_key #>> '{}') AND v.dedupe_key #>> '{}' ~ '[^ ]')
               AND coalesce(v.dedupe, '"spec"') = '"spec"'
               AND coalesce(v.on_conflict, '"ignore"') IN ('"ignore"', '"replace"')
               AND (coalesce(jsonb_typeof(v.key), 'null') = 'null'
                    OR jsonb_typeof(v.key) = 'string' AND length(v.key #>> '{}') BETWEEN 1 AND 256
                       AND queueworker.printable_text(v.key #>> '{}'))
               AND coalesce(v.depends_on, '[]') = '[]'
               AND coalesce(v.on_dependency_failure, '"cancel"') IN ('"cancel"', '"run"')
               AND coalesce(jsonb_typeof(v.headers), 'null') = 'null'
               AND coalesce(v.notify_on_finish, 'false') IN ('true', 'false')
               AND NOT (v.dedupe_key IS NOT NULL AND v.dedupe IS NOT NULL)
               AND (coalesce(v.on_conflict, '"ignore"') <> '"replace"' OR v.dedupe_key IS NOT NULL OR v.dedupe IS NOT NULL),
               false) AS ok
        FROM (SELECT s.n, s.spec, s.spec -> 'task' AS task_value, coalesce(s.spec -> 'payload', '{}') AS payload,
                     s.spec -> 'queue' AS queue_value, s.spec -> 'priority' AS priority, s.spec -> 'run_after' AS run_after,
                     s.spec -> 'delay' AS delay, s.spec -> 'max_attempts' AS max_attempts,
                     s.spec -> 'timeout_seconds' AS timeout_seconds, nullif(s.spec -> 'dedupe_key', 'null') AS dedupe_key,
                     nullif(s.spec -> 'dedupe', 'null') AS dedupe, s.spec -> 'on_conflict' AS on_conflict,
                     nullif(s.spec -> 'key', 'null') AS key, s.spec -> 'depends_on' AS depends_on,
                     s.spec -> 'on_dependency_failure' AS on_dependency_failure, s.spec -> 'headers' AS headers,
                     s.spec -> 'notify_on_finish' AS notify_on_finish
              FROM jsonb_array_elements(specs) WITH ORDINALITY AS s(spec, n)) AS v
        OFFSET 0  -- each spec checked once, not once per aggregate that reads `ok`
    ) AS c;
    IF plain THEN
        RETURN queueworker.enqueue_checked_specs(queues, tasks, payloads, priorities, run_afters, attempts, timeouts,
                                                 dedupe_keys, by_spec, cancel_on_failure, '{}', '{}', header_values,
                                                 keys, replace, notify);
    END IF;
    queues := '{}'; tasks := '{}'; payloads := '{}'; priorities := '{}'; run_afters := '{}'; attempts := '{}';
    timeouts := '{}'; dedupe_keys := '{}'; by_spec := '{}'; cancel_on_failure := '{}'; header_values := '{}';
    keys := '{}'; replace := '{}'; notify := '{}';
    FOR spec, spec_position IN SELECT s.value, s.n FROM jsonb_array_elements(specs) WITH ORDINALITY AS s(value, n) LOOP
        IF jsonb_typeof(spec) <> 'object' THEN
            RAISE EXCEPTION 'queueworker.enqueue_many: spec %: not a JSON object', spec_position
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT k INTO unknown FROM jsonb_object_keys(spec) AS k WHERE k <> ALL (fields) ORDER BY k LIMIT 1;
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION 'queueworker.enqueue_many: spec %: no field %', spec_position, quote_literal(left(unknown, 40))
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'a spec''s fields are ' || array_to_string(fields, ', ');
        END IF;
        task := queueworker.spec_field(spec, spec_position, 'task', 'string', NULL) #>> '{}';
        payload := coalesce(spec -> 'payload', '{}');  -- JSON null is the payload null, as TaskSpec takes None
        queue := queueworker.spec_field(spec, spec_position, 'queue', 'string', '"default"') #>> '{}';
        priority := (queueworker.spec_field(spec, spec_position, 'priority', 'integer', '0') #>> '{}')::bigint;
        run_after := (queueworker.spec_field(spec, spec_position, 'run_after', 'time', NULL) #>> '{}')::timestamptz;
        delay_number := (queueworker.spec_field(spec, spec_position, 'delay', 'number', NULL) #>> '{}')::numeric;
        -- As a double, as Python reads a JSON number: beyond its range any value is refused alike.
        delay := CASE WHEN delay_number > 1e300 THEN 1e300 WHEN delay_number < -1e300 THEN -1e300
                      WHEN abs(delay_number) < 1e-300 THEN 0 ELSE delay_number END;
        max_attempts := (queueworker.spec_field(spec, spec_position, 'max_attempts', 'integer', '10') #>> '{}')::bigint;
        timeout_seconds := (queueworker.spec_field(spec, spec_position, 'timeout_seconds', 'integer', NULL) #>> '{}')::bigint;
        dedupe_key := queueworker.spec_field(spec, spec_position, 'dedupe_key', 'string', NULL) #>> '{}';
        dedupe := queueworker.spec_field(spec, spec_position, 'dedupe', 'string', NULL) #>> '{}';
        on_conflict := queueworker.spec_field(spec, spec_position, 'on_conflict', 'string', '"ignore"') #>> '{}';
        key := queueworker.spec_field(spec, spec_position, 'key', 'string', NULL) #>> '{}';
        depends_on := ARRAY(SELECT (queueworker.spec_field(jsonb_build_object('depends_on', d.id), spec_position, 'depends_on',
                                                           'integer', NULL) #>> '{}')::bigint
                            FROM jsonb_array_elements(queueworker.spec_field(spec, spec_position, 'depends_on', 'array', '[]'))
                                 WITH ORDINALITY AS d(id, n)
                            ORDER BY d.n);
        IF spec -> 'depends_on' = 'null' THEN
            depends_on := NULL;
        END IF;
        on_dependency_failure := queueworker.spec_field(spec, spec_position, 'on_dependency_failure', 'string', '"cancel"') #>> '{}';
        headers := queueworker.spec_field(spec, spec_position, 'headers', 'object', NULL);
        notify_on_finish := (queueworker.spec_field(spec, spec_position, 'notify_on_finish', 'boolean', 'false') #>> '{}')::boolean;
        problem := queueworker.task_spec_problem(task, payload, queue, priority, run_after, delay, max_attempts,
                                                 timeout_seconds, dedupe_key, dedupe, on_conflict, key, depends_on,
                                                 on_dependency_failure, headers, notify_on_finish);
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'queueworker.enqueue_many: spec %: %', spec_position, problem USING ERRCODE = 'invalid_parameter_value';
        END IF;
        queues := queues || queue;
        tasks := tasks || task;
        payloads := payloads || payload;
        priorities := priorities || priority::integer;
        run_afters := run_afters || CASE WHEN delay > 0 THEN now() + delay * interval '1 second' ELSE run_after END;
        attempts := attempts || max_attempts::integer;
        timeouts := timeouts || timeout_seconds::integer;
        dedupe_keys := dedupe_keys || dedupe_key;
        by_spec := by_spec || (dedupe IS NOT NULL);
        cancel_on_failure := cancel_on_failure || (on_dependency_failure = 'cancel');
        prerequisite_ords := prerequisite_ords || array_fill(spec_position, ARRAY[cardinality(depends_on)]);
        prerequisite_ids := prerequisite_ids || depends_on;
        header_values := header_values || headers;
        keys := keys || key;
        replace := replace || (on_conflict = 'replace');
        notify := notify || notify_on_finish;
    END LOOP;
    RETURN queueworker.enqueue_checked_specs(queues, tasks, payloads, priorities, run_afters, attempts, timeouts,
                                             dedupe_keys, by_spec, cancel_on_failure, prerequisite_ords,
                                             prerequisite_ids, header_values, keys, replace, notify);
END
$_$;

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
    SET enable_seqscan TO 'off'
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
               h.spec_hash,
               CASE WHEN s.by_spec THEN encode(h.spec_hash, 'hex') ELSE s.dedupe_key END AS dedupe_key,
               s.ord = ANY(prerequisite_ords) AS blocked
        FROM unnest(queues, tasks, payloads, priorities, run_afters, max_attempts, timeouts, dedupe_keys, by_spec,
                    cancel_on_failure, run_ids, run_partitions, headers, keys)
             WITH ORDINALITY AS s(queue, task, payload, priority, run_after, max_attempts, timeout_seconds,
                                  dedupe_key, by_spec, cancel_on_failure, run_id, run_partition, headers, key, ord)
             CROSS JOIN LATERAL (SELECT queueworker.spec_hash(s.queue, s.task, s.payload) AS spec_hash) AS h
        ORDER BY s.ord
    ), inserted AS (
        INSERT INTO queueworker.tasks_active AS t
            (id, queue, task, state, payload, priority, run_after, delayed, max_attempts, timeout_seconds, dedupe_key,
             run_id, run_partition, headers, key, spec_hash)
        OVERRIDING SYSTEM VALUE  -- the identity is the parent's: an insert aimed at a partition takes ids itself
        SELECT new_id, s.queue, s.task, CASE WHEN s.blocked THEN 'blocked' ELSE 'pending' END::queueworker.task_state,
               s.payload, s.priority, coalesce(s.run_after, now()), coalesce(s.run_after > now(), false),
               s.max_attempts, s.timeout_seconds, s.dedupe_key, s.run_id, s.run_partition, s.headers, s.key,
               s.spec_hash
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
    SET enable_seqscan TO 'off'
    AS $$
BEGIN
    PERFORM queueworker.require_queues(queues);
    RETURN QUERY
    SELECT k.ord, coalesce(a.id, f.id), coalesce(a.state, f.state)::text
    FROM unnest(ords, queues, dedupe_keys) AS k(ord, queue, dedupe_key)
    LEFT JOIN LATERAL (
        SELECT x.id, x.state FROM queueworker.tasks_active x
        WHERE x.queue = k.queue AND x.dedupe_key = k.dedupe_key
        LIMIT 1
    ) a ON true
    LEFT JOIN LATERAL (
        SELECT y.id, y.state FROM queueworker.tasks_finished y
        WHERE a.id IS NULL AND y.queue = k.queue AND y.dedupe_key = k.dedupe_key
        ORDER BY y.finished_at DESC
        LIMIT 1
    ) f ON true
    WHERE coalesce(a.id, f.id) IS NOT NULL
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
            PERFORM queueworker.make_keyed(newly_keyed);
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
DECLARE
    nestloop text := current_setting('enable_nestloop');
    ids bigint[];
    stale bigint[];
BEGIN
    IF NOT EXISTS (SELECT FROM queueworker.queues q WHERE q.keyed) THEN
        RETURN NULL;
    END IF;
    -- Without nested loops: audit_task_updates (10_audit.sql) says why.
    PERFORM set_config('enable_nestloop', 'off', true);
    SELECT array_agg(n.id), array_agg(n.id) FILTER (WHERE n.fair_tag IS NOT NULL) INTO ids, stale
    FROM new_rows n
    JOIN old_rows o ON o.id = n.id
    JOIN queueworker.queues q ON q.name = n.queue AND q.keyed
    WHERE n.state = 'pending' AND NOT n.delayed
      AND (NOT (o.state = 'pending' AND NOT o.delayed) OR n.priority <> o.priority);
    PERFORM set_config('enable_nestloop', nestloop, true);
    IF ids IS NOT NULL THEN
        PERFORM queueworker.tag_fair(ids, stale);
    END IF;
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

CREATE FUNCTION queueworker.key_breaker_next(queue_name text, state text, streak integer, any_succeeded boolean, failures integer) RETURNS text
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE WHEN threshold IS NULL THEN state
                WHEN state = 'half_open' AND now_streak > 0 THEN 'open'
                WHEN state = 'half_open' AND any_succeeded THEN 'closed'
                WHEN state = 'closed' AND now_streak >= threshold THEN 'open'
                ELSE state END
    FROM (SELECT (SELECT q.key_breaker_failures FROM queueworker.queues q WHERE q.name = queue_name) AS threshold,
                 CASE WHEN any_succeeded THEN failures ELSE streak + failures END AS now_streak) AS d
$$;

CREATE FUNCTION queueworker.key_capacity(queue_name text, sample integer, task_seconds double precision) RETURNS jsonb
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    size integer;
    capacity jsonb;
BEGIN
    IF queue_name IS NULL OR sample IS NULL OR sample < 1
       OR task_seconds IS NOT NULL AND NOT (task_seconds >= 0 AND task_seconds < 'Infinity'::float8) THEN
        RAISE EXCEPTION 'key_capacity: a queue name, a sample of at least 1 and a finite task duration of 0 '
                        'or more are needed' USING ERRCODE = '22023';
    END IF;
    size := least(sample, 100000);
    WITH settings AS MATERIALIZED (
        SELECT q.name, q.key_rate_per_second, q.key_max_running, q.key_breaker_failures,
               q.key_breaker_cooldown_seconds
        FROM queueworker.queues q WHERE q.name = queue_name AND q.key_limited
    ), tagged AS MATERIALIZED (
        SELECT coalesce(t.key, '') AS key
        FROM queueworker.tasks_active t
        WHERE t.state = 'pending' AND NOT t.delayed AND t.fair_tag IS NOT NULL AND t.queue = queue_name
          AND t.run_after <= now() AND EXISTS (SELECT FROM settings)
        ORDER BY t.priority DESC, t.fair_tag, t.id
        LIMIT size
    ), sampled AS MATERIALIZED (
        SELECT g.key FROM tagged g
        UNION ALL
        SELECT h.key FROM (
            SELECT coalesce(t.key, '') AS key, t.fair_tag
            FROM queueworker.tasks_active t
            WHERE t.state = 'pending' AND NOT t.delayed AND t.queue = queue_name
              AND t.run_after <= now() AND EXISTS (SELECT FROM settings)
            ORDER BY t.priority DESC, t.run_after, t.id
            LIMIT size - (SELECT count(*) FROM tagged)) AS h
        WHERE h.fair_tag IS NULL
    ), per_key AS (
        SELECT coalesce(r.key, u.key) AS key, coalesce(r.n, 0) AS ready, coalesce(u.n, 0) AS running
        FROM (SELECT s.key, count(*) AS n FROM sampled s GROUP BY s.key) AS r
        FULL JOIN (SELECT coalesce(t.key, '') AS key, count(*) AS n
                   FROM queueworker.tasks_active t
                   WHERE t.queue = queue_name AND t.state = 'running' AND t.fair_tag IS NOT NULL
                     AND EXISTS (SELECT FROM settings)
                   GROUP BY 1) AS u ON u.key = r.key
    ), limited AS (
        SELECT p.ready, p.running,
               coalesce(k.paused_until > now(), false)
               OR coalesce(s.key_breaker_failures IS NOT NULL AND b.breaker_state <> 'closed'
                           AND now() < b.breaker_changed_at + make_interval(secs => s.key_breaker_cooldown_seconds),
                           false) AS held,
               coalesce(s.key_breaker_failures IS NOT NULL AND b.breaker_state <> 'closed', false) AS probe,
               coalesce(k.max_running, s.key_max_running) AS cap,
               coalesce(k.rate_per_second, s.key_rate_per_second) AS rate
        FROM per_key p CROSS JOIN settings s
        LEFT JOIN LATERAL (SELECT * FROM queueworker.queue_keys k
                           WHERE k.queue = queue_name AND k.key = p.key LIMIT 1) AS k ON true
        LEFT JOIN LATERAL (SELECT * FROM queueworker.key_state b
                           WHERE b.queue = queue_name AND b.key = p.key LIMIT 1) AS b ON true
    ), slots AS (
        SELECT l.ready, l.held, l.ready + l.running AS wanted,
               CASE WHEN l.held THEN l.running
                    WHEN l.probe THEN l.running + least(l.ready, 1)
                    ELSE greatest(l.running, least(
                        l.ready + l.running, l.cap,
                        CASE WHEN l.rate IS NULL THEN NULL
                             WHEN task_seconds IS NULL THEN 1
                             ELSE greatest(1, ceil(least(l.rate * task_seconds, 1e9)))::bigint END))
               END AS n
        FROM limited l
    )
    SELECT jsonb_build_object(
               'key_slots', CASE WHEN (SELECT count(*) FROM sampled) >= size AND NOT bool_or(s.n < s.wanted) THEN NULL
                                 ELSE coalesce(sum(s.n), 0) END,
               'keys_ready', count(*) FILTER (WHERE s.ready > 0),
               'keys_held', count(*) FILTER (WHERE s.ready > 0 AND s.held))
    INTO capacity
    FROM slots s
    HAVING EXISTS (SELECT FROM settings);
    RETURN capacity;
END
$$;

CREATE FUNCTION queueworker.key_limited_queue_keyed() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM queueworker.make_keyed(ARRAY[NEW.name]);
    RETURN NULL;
END
$$;

CREATE FUNCTION queueworker.lock_key_limited_queue(queue_name text) RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT queueworker.lock_key_limited_queue(queue_name, false)
$$;

CREATE FUNCTION queueworker.lock_key_limited_queue(queue_name text, knows_key_breakers boolean) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    has_key_breaker boolean;
BEGIN
    SELECT q.key_breaker_failures IS NOT NULL INTO has_key_breaker
    FROM queueworker.queues q WHERE q.name = queue_name FOR NO KEY UPDATE;
    IF has_key_breaker AND knows_key_breakers IS NOT TRUE THEN  -- NULL is not knowing
        PERFORM set_config('queueworker.blind_key_claim', 'on', true);
    END IF;
    IF EXISTS (SELECT FROM queueworker.queue_keys k
               WHERE k.queue = queue_name AND k.paused_until IS NOT NULL AND k.paused_until <= now()) THEN
        DELETE FROM queueworker.queue_keys k
        WHERE k.queue = queue_name AND k.paused_until IS NOT NULL AND k.paused_until <= now()
          AND num_nonnulls(k.weight, k.rate_per_second, k.max_running) = 0;
        UPDATE queueworker.queue_keys k SET paused_until = NULL, updated_at = now()
        WHERE k.queue = queue_name AND k.paused_until IS NOT NULL AND k.paused_until <= now();
    END IF;
END
$$;

CREATE FUNCTION queueworker.make_keyed(queues text[]) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO queueworker.queues (name, keyed) SELECT unnest(queues), true
    ON CONFLICT (name) DO UPDATE SET keyed = true, updated_at = now();
    PERFORM pg_notify('queueworker_queues', q) FROM unnest(queues) AS q;
    PERFORM queueworker.tag_fair(
        ARRAY(SELECT t.id FROM queueworker.tasks_active t
              WHERE t.queue = ANY(queues) AND t.state = 'pending' AND NOT t.delayed),
        ARRAY(SELECT t.id FROM queueworker.tasks_active t
              WHERE t.queue = ANY(queues) AND t.state = 'pending' AND NOT t.delayed
                AND t.fair_tag IS NOT NULL));
END
$$;

CREATE FUNCTION queueworker.mark_notify_on_finish(ids bigint[]) RETURNS SETOF bigint
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    UPDATE queueworker.tasks SET notify_on_finish = true
    WHERE id = ANY(ids) AND NOT notify_on_finish AND queue LIKE ANY ((SELECT queueworker.queue_patterns())::text[])
    RETURNING id
$$;

CREATE FUNCTION queueworker.note_key_limits() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    queue_name text := CASE WHEN TG_OP = 'DELETE' THEN OLD.queue ELSE NEW.queue END;
    has_limits boolean;
BEGIN
    has_limits := EXISTS (SELECT FROM queueworker.queue_keys k
                          WHERE k.queue = queue_name
                            AND num_nonnulls(k.rate_per_second, k.max_running, k.paused_until) > 0);
    IF has_limits THEN
        INSERT INTO queueworker.queues AS q (name, key_limits) VALUES (queue_name, true)
        ON CONFLICT (name) DO UPDATE SET key_limits = true, updated_at = now() WHERE NOT q.key_limits;
    ELSE
        UPDATE queueworker.queues SET key_limits = false, updated_at = now()
        WHERE name = queue_name AND key_limits;
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION queueworker.notify_finished() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

CREATE FUNCTION queueworker.printable_text(value text) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
    SELECT value !~ ('['
        '\u0001-\u001F\u007F-\u00A0\u00AD\u0378-\u0379\u0380-\u0383\u038B\u038D\u03A2\u0530\u0557-\u0558'
        '\u058B-\u058C\u0590\u05C8-\u05CF\u05EB-\u05EE\u05F5-\u0605\u061C\u06DD\u070E-\u070F\u074B-\u074C'
        '\u07B2-\u07BF\u07FB-\u07FC\u082E-\u082F\u083F\u085C-\u085D\u085F\u086B-\u086F\u088F-\u0897\u08E2'
        '\u0984\u098D-\u098E\u0991-\u0992\u09A9\u09B1\u09B3-\u09B5\u09BA-\u09BB\u09C5-\u09C6\u09C9-\u09CA'
        '\u09CF-\u09D6\u09D8-\u09DB\u09DE\u09E4-\u09E5\u09FF-\u0A00\u0A04\u0A0B-\u0A0E\u0A11-\u0A12\u0A29'
        '\u0A31\u0A34\u0A37\u0A3A-\u0A3B\u0A3D\u0A43-\u0A46\u0A49-\u0A4A\u0A4E-\u0A50\u0A52-\u0A58\u0A5D'
        '\u0A5F-\u0A65\u0A77-\u0A80\u0A84\u0A8E\u0A92\u0AA9\u0AB1\u0AB4\u0ABA-\u0ABB\u0AC6\u0ACA'
        '\u0ACE-\u0ACF\u0AD1-\u0ADF\u0AE4-\u0AE5\u0AF2-\u0AF8\u0B00\u0B04\u0B0D-\u0B0E\u0B11-\u0B12\u0B29'
        '\u0B31\u0B34\u0B3A-\u0B3B\u0B45-\u0B46\u0B49-\u0B4A\u0B4E-\u0B54\u0B58-\u0B5B\u0B5E\u0B64-\u0B65'
        '\u0B78-\u0B81\u0B84\u0B8B-\u0B8D\u0B91\u0B96-\u0B98\u0B9B\u0B9D\u0BA0-\u0BA2\u0BA5-\u0BA7'
        '\u0BAB-\u0BAD\u0BBA-\u0BBD\u0BC3-\u0BC5\u0BC9\u0BCE-\u0BCF\u0BD1-\u0BD6\u0BD8-\u0BE5'
        '\u0BFB-\u0BFF\u0C0D\u0C11\u0C29\u0C3A-\u0C3B\u0C45\u0C49\u0C4E-\u0C54\u0C57\u0C5B-\u0C5C'
        '\u0C5E-\u0C5F\u0C64-\u0C65\u0C70-\u0C76\u0C8D\u0C91\u0CA9\u0CB4\u0CBA-\u0CBB\u0CC5\u0CC9'
        '\u0CCE-\u0CD4\u0CD7-\u0CDC\u0CDF\u0CE4-\u0CE5\u0CF0\u0CF3-\u0CFF\u0D0D\u0D11\u0D45\u0D49'
        '\u0D50-\u0D53\u0D64-\u0D65\u0D80\u0D84\u0D97-\u0D99\u0DB2\u0DBC\u0DBE-\u0DBF\u0DC7-\u0DC9'
        '\u0DCB-\u0DCE\u0DD5\u0DD7\u0DE0-\u0DE5\u0DF0-\u0DF1\u0DF5-\u0E00\u0E3B-\u0E3E\u0E5C-\u0E80\u0E83'
        '\u0E85\u0E8B\u0EA4\u0EA6\u0EBE-\u0EBF\u0EC5\u0EC7\u0ECE-\u0ECF\u0EDA-\u0EDB\u0EE0-\u0EFF\u0F48'
        '\u0F6D-\u0F70\u0F98\u0FBD\u0FCD\u0FDB-\u0FFF\u10C6\u10C8-\u10CC\u10CE-\u10CF\u1249\u124E-\u124F'
        '\u1257\u1259\u125E-\u125F\u1289\u128E-\u128F\u12B1\u12B6-\u12B7\u12BF\u12C1\u12C6-\u12C7\u12D7'
        '\u1311\u1316-\u1317\u135B-\u135C\u137D-\u137F\u139A-\u139F\u13F6-\u13F7\u13FE-\u13FF\u1680'
        '\u169D-\u169F\u16F9-\u16FF\u1716-\u171E\u1737-\u173F\u1754-\u175F\u176D\u1771\u1774-\u177F'
        '\u17DE-\u17DF\u17EA-\u17EF\u17FA-\u17FF\u180E\u181A-\u181F\u1879-\u187F\u18AB-\u18AF'
        '\u18F6-\u18FF\u191F\u192C-\u192F\u193C-\u193F\u1941-\u1943\u196E-\u196F\u1975-\u197F'
        '\u19AC-\u19AF\u19CA-\u19CF\u19DB-\u19DD\u1A1C-\u1A1D\u1A5F\u1A7D-\u1A7E\u1A8A-\u1A8F'
        '\u1A9A-\u1A9F\u1AAE-\u1AAF\u1ACF-\u1AFF\u1B4D-\u1B4F\u1B7F\u1BF4-\u1BFB\u1C38-\u1C3A'
        '\u1C4A-\u1C4C\u1C89-\u1C8F\u1CBB-\u1CBC\u1CC8-\u1CCF\u1CFB-\u1CFF\u1F16-\u1F17\u1F1E-\u1F1F'
        '\u1F46-\u1F47\u1F4E-\u1F4F\u1F58\u1F5A\u1F5C\u1F5E\u1F7E-\u1F7F\u1FB5\u1FC5\u1FD4-\u1FD5\u1FDC'
        '\u1FF0-\u1FF1\u1FF5\u1FFF-\u200F\u2028-\u202F\u205F-\u206F\u2072-\u2073\u208F\u209D-\u209F'
        '\u20C1-\u20CF\u20F1-\u20FF\u218C-\u218F\u2427-\u243F\u244B-\u245F\u2B74-\u2B75\u2B96'
        '\u2CF4-\u2CF8\u2D26\u2D28-\u2D2C\u2D2E-\u2D2F\u2D68-\u2D6E\u2D71-\u2D7E\u2D97-\u2D9F\u2DA7\u2DAF'
        '\u2DB7\u2DBF\u2DC7\u2DCF\u2DD7\u2DDF\u2E5E-\u2E7F\u2E9A\u2EF4-\u2EFF\u2FD6-\u2FEF\u2FFC-\u3000'
        '\u3040\u3097-\u3098\u3100-\u3104\u3130\u318F\u31E4-\u31EF\u321F\uA48D-\uA48F\uA4C7-\uA4CF'
        '\uA62C-\uA63F\uA6F8-\uA6FF\uA7CB-\uA7CF\uA7D2\uA7D4\uA7DA-\uA7F1\uA82D-\uA82F\uA83A-\uA83F'
        '\uA878-\uA87F\uA8C6-\uA8CD\uA8DA-\uA8DF\uA954-\uA95E\uA97D-\uA97F\uA9CE\uA9DA-\uA9DD\uA9FF'
        '\uAA37-\uAA3F\uAA4E-\uAA4F\uAA5A-\uAA5B\uAAC3-\uAADA\uAAF7-\uAB00\uAB07-\uAB08\uAB0F-\uAB10'
        '\uAB17-\uAB1F\uAB27\uAB2F\uAB6C-\uAB6F\uABEE-\uABEF\uABFA-\uABFF\uD7A4-\uD7AF\uD7C7-\uD7CA'
        '\uD7FC-\uD7FF\uE000-\uF8FF\uFA6E-\uFA6F\uFADA-\uFAFF\uFB07-\uFB12\uFB18-\uFB1C\uFB37\uFB3D\uFB3F'
        '\uFB42\uFB45\uFBC3-\uFBD2\uFD90-\uFD91\uFDC8-\uFDCE\uFDD0-\uFDEF\uFE1A-\uFE1F\uFE53\uFE67'
        '\uFE6C-\uFE6F\uFE75\uFEFD-\uFF00\uFFBF-\uFFC1\uFFC8-\uFFC9\uFFD0-\uFFD1\uFFD8-\uFFD9'
        '\uFFDD-\uFFDF\uFFE7\uFFEF-\uFFFB\uFFFE-\uFFFF\U0001000C\U00010027\U0001003B\U0001003E'
        '\U0001004E-\U0001004F\U0001005E-\U0001007F\U000100FB-\U000100FF\U00010103-\U00010106'
        '\U00010134-\U00010136\U0001018F\U0001019D-\U0001019F\U000101A1-\U000101CF\U000101FE-\U0001027F'
        '\U0001029D-\U0001029F\U000102D1-\U000102DF\U000102FC-\U000102FF\U00010324-\U0001032C'
        '\U0001034B-\U0001034F\U0001037B-\U0001037F\U0001039E\U000103C4-\U000103C7\U000103D6-\U000103FF'
        '\U0001049E-\U0001049F\U000104AA-\U000104AF\U000104D4-\U000104D7\U000104FC-\U000104FF'
        '\U00010528-\U0001052F\U00010564-\U0001056E\U0001057B\U0001058B\U00010593\U00010596\U000105A2'
        '\U000105B2\U000105BA\U000105BD-\U000105FF\U00010737-\U0001073F\U00010756-\U0001075F'
        '\U00010768-\U0001077F\U00010786\U000107B1\U000107BB-\U000107FF\U00010806-\U00010807\U00010809'
        '\U00010836\U00010839-\U0001083B\U0001083D-\U0001083E\U00010856\U0001089F-\U000108A6'
        '\U000108B0-\U000108DF\U000108F3\U000108F6-\U000108FA\U0001091C-\U0001091E\U0001093A-\U0001093E'
        '\U00010940-\U0001097F\U000109B8-\U000109BB\U000109D0-\U000109D1\U00010A04\U00010A07-\U00010A0B'
        '\U00010A14\U00010A18\U00010A36-\U00010A37\U00010A3B-\U00010A3E\U00010A49-\U00010A4F'
        '\U00010A59-\U00010A5F\U00010AA0-\U00010ABF\U00010AE7-\U00010AEA\U00010AF7-\U00010AFF'
        '\U00010B36-\U00010B38\U00010B56-\U00010B57\U00010B73-\U00010B77\U00010B92-\U00010B98'
        '\U00010B9D-\U00010BA8\U00010BB0-\U00010BFF\U00010C49-\U00010C7F\U00010CB3-\U00010CBF'
        '\U00010CF3-\U00010CF9\U00010D28-\U00010D2F\U00010D3A-\U00010E5F\U00010E7F\U00010EAA'
        '\U00010EAE-\U00010EAF\U00010EB2-\U00010EFF\U00010F28-\U00010F2F\U00010F5A-\U00010F6F'
        '\U00010F8A-\U00010FAF\U00010FCC-\U00010FDF\U00010FF7-\U00010FFF\U0001104E-\U00011051'
        '\U00011076-\U0001107E\U000110BD\U000110C3-\U000110CF\U000110E9-\U000110EF\U000110FA-\U000110FF'
        '\U00011135\U00011148-\U0001114F\U00011177-\U0001117F\U000111E0\U000111F5-\U000111FF\U00011212'
        '\U0001123F-\U0001127F\U00011287\U00011289\U0001128E\U0001129E\U000112AA-\U000112AF'
        '\U000112EB-\U000112EF\U000112FA-\U000112FF\U00011304\U0001130D-\U0001130E\U00011311-\U00011312'
        '\U00011329\U00011331\U00011334\U0001133A\U00011345-\U00011346\U00011349-\U0001134A'
        '\U0001134E-\U0001134F\U00011351-\U00011356\U00011358-\U0001135C\U00011364-\U00011365'
        '\U0001136D-\U0001136F\U00011375-\U000113FF\U0001145C\U00011462-\U0001147F\U000114C8-\U000114CF'
        '\U000114DA-\U0001157F\U000115B6-\U000115B7\U000115DE-\U000115FF\U00011645-\U0001164F'
        '\U0001165A-\U0001165F\U0001166D-\U0001167F\U000116BA-\U000116BF\U000116CA-\U000116FF'
        '\U0001171B-\U0001171C\U0001172C-\U0001172F\U00011747-\U000117FF\U0001183C-\U0001189F'
        '\U000118F3-\U000118FE\U00011907-\U00011908\U0001190A-\U0001190B\U00011914\U00011917\U00011936'
        '\U00011939-\U0001193A\U00011947-\U0001194F\U0001195A-\U0001199F\U000119A8-\U000119A9'
        '\U000119D8-\U000119D9\U000119E5-\U000119FF\U00011A48-\U00011A4F\U00011AA3-\U00011AAF'
        '\U00011AF9-\U00011BFF\U00011C09\U00011C37\U00011C46-\U00011C4F\U00011C6D-\U00011C6F'
        '\U00011C90-\U00011C91\U00011CA8\U00011CB7-\U00011CFF\U00011D07\U00011D0A\U00011D37-\U00011D39'
        '\U00011D3B\U00011D3E\U00011D48-\U00011D4F\U00011D5A-\U00011D5F\U00011D66\U00011D69\U00011D8F'
        '\U00011D92\U00011D99-\U00011D9F\U00011DAA-\U00011EDF\U00011EF9-\U00011FAF\U00011FB1-\U00011FBF'
        '\U00011FF2-\U00011FFE\U0001239A-\U000123FF\U0001246F\U00012475-\U0001247F\U00012544-\U00012F8F'
        '\U00012FF3-\U00012FFF\U0001342F-\U000143FF\U00014647-\U000167FF\U00016A39-\U00016A3F\U00016A5F'
        '\U00016A6A-\U00016A6D\U00016ABF\U00016ACA-\U00016ACF\U00016AEE-\U00016AEF\U00016AF6-\U00016AFF'
        '\U00016B46-\U00016B4F\U00016B5A\U00016B62\U00016B78-\U00016B7C\U00016B90-\U00016E3F'
        '\U00016E9B-\U00016EFF\U00016F4B-\U00016F4E\U00016F88-\U00016F8E\U00016FA0-\U00016FDF'
        '\U00016FE5-\U00016FEF\U00016FF2-\U00016FFF\U000187F8-\U000187FF\U00018CD6-\U00018CFF'
        '\U00018D09-\U0001AFEF\U0001AFF4\U0001AFFC\U0001AFFF\U0001B123-\U0001B14F\U0001B153-\U0001B163'
        '\U0001B168-\U0001B16F\U0001B2FC-\U0001BBFF\U0001BC6B-\U0001BC6F\U0001BC7D-\U0001BC7F'
        '\U0001BC89-\U0001BC8F\U0001BC9A-\U0001BC9B\U0001BCA0-\U0001CEFF\U0001CF2E-\U0001CF2F'
        '\U0001CF47-\U0001CF4F\U0001CFC4-\U0001CFFF\U0001D0F6-\U0001D0FF\U0001D127-\U0001D128'
        '\U0001D173-\U0001D17A\U0001D1EB-\U0001D1FF\U0001D246-\U0001D2DF\U0001D2F4-\U0001D2FF'
        '\U0001D357-\U0001D35F\U0001D379-\U0001D3FF\U0001D455\U0001D49D\U0001D4A0-\U0001D4A1'
        '\U0001D4A3-\U0001D4A4\U0001D4A7-\U0001D4A8\U0001D4AD\U0001D4BA\U0001D4BC\U0001D4C4\U0001D506'
        '\U0001D50B-\U0001D50C\U0001D515\U0001D51D\U0001D53A\U0001D53F\U0001D545\U0001D547-\U0001D549'
        '\U0001D551\U0001D6A6-\U0001D6A7\U0001D7CC-\U0001D7CD\U0001DA8C-\U0001DA9A\U0001DAA0'
        '\U0001DAB0-\U0001DEFF\U0001DF1F-\U0001DFFF\U0001E007\U0001E019-\U0001E01A\U0001E022\U0001E025'
        '\U0001E02B-\U0001E0FF\U0001E12D-\U0001E12F\U0001E13E-\U0001E13F\U0001E14A-\U0001E14D'
        '\U0001E150-\U0001E28F\U0001E2AF-\U0001E2BF\U0001E2FA-\U0001E2FE\U0001E300-\U0001E7DF\U0001E7E7'
        '\U0001E7EC\U0001E7EF\U0001E7FF\U0001E8C5-\U0001E8C6\U0001E8D7-\U0001E8FF\U0001E94C-\U0001E94F'
        '\U0001E95A-\U0001E95D\U0001E960-\U0001EC70\U0001ECB5-\U0001ED00\U0001ED3E-\U0001EDFF\U0001EE04'
        '\U0001EE20\U0001EE23\U0001EE25-\U0001EE26\U0001EE28\U0001EE33\U0001EE38\U0001EE3A'
        '\U0001EE3C-\U0001EE41\U0001EE43-\U0001EE46\U0001EE48\U0001EE4A\U0001EE4C\U0001EE50\U0001EE53'
        '\U0001EE55-\U0001EE56\U0001EE58\U0001EE5A\U0001EE5C\U0001EE5E\U0001EE60\U0001EE63'
        '\U0001EE65-\U0001EE66\U0001EE6B\U0001EE73\U0001EE78\U0001EE7D\U0001EE7F\U0001EE8A'
        '\U0001EE9C-\U0001EEA0\U0001EEA4\U0001EEAA\U0001EEBC-\U0001EEEF\U0001EEF2-\U0001EFFF'
        '\U0001F02C-\U0001F02F\U0001F094-\U0001F09F\U0001F0AF-\U0001F0B0\U0001F0C0\U0001F0D0'
        '\U0001F0F6-\U0001F0FF\U0001F1AE-\U0001F1E5\U0001F203-\U0001F20F\U0001F23C-\U0001F23F'
        '\U0001F249-\U0001F24F\U0001F252-\U0001F25F\U0001F266-\U0001F2FF\U0001F6D8-\U0001F6DC'
        '\U0001F6ED-\U0001F6EF\U0001F6FD-\U0001F6FF\U0001F774-\U0001F77F\U0001F7D9-\U0001F7DF'
        '\U0001F7EC-\U0001F7EF\U0001F7F1-\U0001F7FF\U0001F80C-\U0001F80F\U0001F848-\U0001F84F'
        '\U0001F85A-\U0001F85F\U0001F888-\U0001F88F\U0001F8AE-\U0001F8AF\U0001F8B2-\U0001F8FF'
        '\U0001FA54-\U0001FA5F\U0001FA6E-\U0001FA6F\U0001FA75-\U0001FA77\U0001FA7D-\U0001FA7F'
        '\U0001FA87-\U0001FA8F\U0001FAAD-\U0001FAAF\U0001FABB-\U0001FABF\U0001FAC6-\U0001FACF'
        '\U0001FADA-\U0001FADF\U0001FAE8-\U0001FAEF\U0001FAF7-\U0001FAFF\U0001FB93\U0001FBCB-\U0001FBEF'
        '\U0001FBFA-\U0001FFFF\U0002A6E0-\U0002A6FF\U0002B739-\U0002B73F\U0002B81E-\U0002B81F'
        '\U0002CEA2-\U0002CEAF\U0002EBE1-\U0002F7FF\U0002FA1E-\U0002FFFF\U0003134B-\U000E00FF'
        '\U000E01F0-\U0010FFFF'
        ']')
$$;

CREATE FUNCTION queueworker.python_json_length(value text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
    SELECT 2 + pg_catalog.length(value)
           + pg_catalog.length(pg_catalog.regexp_replace(value, '[^"\\]', '', 'g'))
           + 5 * pg_catalog.length(pg_catalog.regexp_replace(value, '[^\u0080-\uFFFF]', '', 'g'))
           + 11 * pg_catalog.length(pg_catalog.regexp_replace(value, '[^\U00010000-\U0010FFFF]', '', 'g'))
$$;

CREATE FUNCTION queueworker.queue_patterns() RETURNS text[]
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

CREATE FUNCTION queueworker.refuse_claims_blind_to_key_limits() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF current_setting('queueworker.blind_key_claim', true) = 'on'
       OR EXISTS (SELECT FROM queueworker.queues q WHERE q.name = NEW.queue AND q.key_limited) THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
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

CREATE FUNCTION queueworker.retag_resumed_key() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    waiting bigint[];
BEGIN
    waiting := ARRAY(SELECT t.id FROM queueworker.tasks_active t
                     WHERE t.queue = OLD.queue AND t.key = OLD.key AND t.state = 'pending' AND NOT t.delayed
                     ORDER BY t.id);
    IF cardinality(waiting) > 0 AND EXISTS (SELECT FROM queueworker.queues q WHERE q.name = OLD.queue AND q.keyed) THEN
        PERFORM queueworker.tag_fair(waiting, waiting);
    END IF;
    RETURN NULL;
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
    SET enable_seqscan TO 'off'
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
    SET enable_seqscan TO 'off'
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

CREATE FUNCTION queueworker.spec_field(spec jsonb, spec_position bigint, field text, kind text, fallback jsonb) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    value jsonb := spec -> field;
BEGIN
    IF value IS NULL THEN
        RETURN fallback;
    END IF;
    IF jsonb_typeof(value) = 'null' THEN
        RETURN NULL;
    END IF;
    IF kind = 'integer' AND jsonb_typeof(value) = 'number' AND value::text ~ '^-?[0-9]{1,19}$'
       AND value::text::numeric BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
        RETURN value;
    END IF;
    IF kind = 'time' AND jsonb_typeof(value) = 'string'
       AND value #>> '{}' ~ '^\d{4,}-\d\d-\d\d[Tt ]\d\d:\d\d(:\d\d(\.\d+)?)?([Zz]|[+-]\d\d(:?\d\d(:?\d\d)?)?)$' THEN
        BEGIN
            PERFORM (value #>> '{}')::timestamptz;
            RETURN value;
        EXCEPTION WHEN datetime_field_overflow OR invalid_datetime_format THEN
            NULL;  -- refused below, as any other value that is not a time
        END;
    END IF;
    IF jsonb_typeof(value) = kind THEN
        RETURN value;
    END IF;
    RAISE EXCEPTION 'queueworker.enqueue_many: spec %: % must be %', spec_position, field,
        CASE kind WHEN 'integer' THEN 'a JSON integer (of 64 bits at most)' WHEN 'time' THEN 'a time with its offset (2026-11-27T10:00:00Z)'
                  ELSE 'a JSON ' || kind END
        USING ERRCODE = 'invalid_parameter_value';
END
$_$;

CREATE FUNCTION queueworker.spec_hash(queue text, task text, payload jsonb) RETURNS bytea
    LANGUAGE sql STABLE PARALLEL SAFE
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
    SET enable_seqscan TO 'off'
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
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    tags jsonb;
BEGIN
    IF stale IS NOT NULL THEN
        UPDATE queueworker.tasks_active t SET fair_tag = NULL
        WHERE t.id = ANY(stale) AND t.fair_tag IS NOT NULL AND t.state = 'pending' AND t.delayed IS NOT TRUE;
    END IF;
    -- A window numbers each group's rows, the first row of each group makes the group's probes (a
    -- CASE evaluates its subqueries only where its branch is taken), and a window hands the group's
    -- start and step to its other rows. The probes run before any row is updated: a probe made
    -- while an update ran would walk past the index entries that update had just added (invisible
    -- to it), and cost grew with the square of the batch.
    WITH ranked AS MATERIALIZED (
        SELECT t.id, t.queue, t.key, t.priority,
               row_number() OVER (PARTITION BY t.queue, t.key, t.priority ORDER BY t.id) AS rank
        FROM queueworker.tasks_active t
        WHERE t.id = ANY(ids) AND t.state = 'pending' AND t.delayed IS NOT TRUE
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
    )
    SELECT jsonb_object_agg(g.id::text, g.tag) INTO tags
    FROM (SELECT p.id, max(p.start) OVER w + p.rank * max(p.step) OVER w AS tag
          FROM probed p
          WINDOW w AS (PARTITION BY p.queue, p.key, p.priority)) AS g;
    IF tags IS NOT NULL THEN
        UPDATE queueworker.tasks_active t
        SET fair_tag = (tags ->> t.id::text)::float8
        WHERE t.id = ANY(ids) AND t.state = 'pending' AND t.delayed IS NOT TRUE AND tags ? t.id::text;
    END IF;
END
$$;

CREATE FUNCTION queueworker.task_spec_problem(task text, payload jsonb, queue text, priority bigint, run_after timestamp with time zone, delay double precision, max_attempts bigint, timeout_seconds bigint, dedupe_key text, dedupe text, on_conflict text, key text, depends_on bigint[], on_dependency_failure text, headers jsonb, notify_on_finish boolean) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    header record;
    header_bytes bigint := 2;
BEGIN
    IF task IS NULL OR length(task) NOT BETWEEN 1 AND 200 OR NOT queueworker.printable_text(task) OR task !~ '[^ ]' THEN
        RETURN 'task must be printable text of 1 to 200 characters, not only spaces';
    END IF;
    IF payload IS NULL THEN
        RETURN 'payload must be JSON';
    END IF;
    IF jsonb_path_exists(payload, 'strict $.**{900} ? (@.type() == "object" || @.type() == "array")') THEN
        RETURN 'payload is nested more than 900 levels deep';
    END IF;
    -- A number of more than 4,300 digits takes more than 4,300 characters: most payloads are shorter.
    IF length(payload::text) > 4300 AND EXISTS (
        SELECT FROM jsonb_path_query(payload, 'strict $.** ? (@.type() == "number")') AS n(value)
        WHERE n.value #>> '{}' !~ '[.eE]' AND length(ltrim(n.value #>> '{}', '-')) > 4300) THEN
        RETURN 'payload holds an integer of more than 4,300 digits';
    END IF;
    IF queue IS NULL OR queue !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' THEN
        RETURN 'queue must be letters, digits and _.:- (starting with a letter or digit), at most 128 characters';
    END IF;
    IF priority IS NULL OR priority NOT BETWEEN -2147483648 AND 2147483647 THEN
        RETURN 'priority must be an integer from -2147483648 to 2147483647';
    END IF;
    IF delay IS NOT NULL AND NOT (delay >= 0 AND delay <= 2147483647) THEN  -- NaN compares above every number
        RETURN 'delay must be a number of seconds from 0 to 2147483647';
    END IF;
    IF max_attempts IS NULL OR max_attempts NOT BETWEEN 1 AND 1000 THEN
        RETURN 'max_attempts must be an integer from 1 to 1000';
    END IF;
    IF timeout_seconds NOT BETWEEN 1 AND 2147483647 THEN
        RETURN 'timeout_seconds must be NULL or an integer from 1 to 2147483647';
    END IF;
    IF length(dedupe_key) NOT BETWEEN 1 AND 512 OR NOT queueworker.printable_text(dedupe_key) OR dedupe_key !~ '[^ ]' THEN
        RETURN 'dedupe_key must be NULL or printable text of 1 to 512 characters, not only spaces';
    END IF;
    IF dedupe IS DISTINCT FROM 'spec' AND dedupe IS NOT NULL THEN
        RETURN 'dedupe must be NULL or ''spec''';
    END IF;
    IF on_conflict IS NULL OR on_conflict NOT IN ('ignore', 'replace') THEN
        RETURN 'on_conflict must be ''ignore'' or ''replace''';
    END IF;
    IF depends_on IS NULL OR array_ndims(depends_on) > 1 OR array_position(depends_on, NULL) IS NOT NULL
       OR EXISTS (SELECT FROM unnest(depends_on) AS d(id) WHERE d.id < 1) THEN
        RETURN 'depends_on must be an array of task ids (integers from 1)';
    END IF;
    IF cardinality(depends_on) > 1000 THEN
        RETURN 'depends_on lists more than 1000 tasks';
    END IF;
    IF on_dependency_failure IS NULL OR on_dependency_failure NOT IN ('cancel', 'run') THEN
        RETURN 'on_dependency_failure must be ''cancel'' or ''run''';
    END IF;
    IF notify_on_finish IS NULL THEN
        RETURN 'notify_on_finish must be true or false';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'null' THEN
        IF jsonb_typeof(headers) <> 'object' THEN
            RETURN 'headers must be NULL or a JSON object of strings';
        END IF;
        FOR header IN SELECT h.key AS name, h.value FROM jsonb_each(headers) AS h LOOP
            IF length(header.name) NOT BETWEEN 1 AND 128 OR NOT queueworker.printable_text(header.name)
               OR header.name !~ '[^ ]' THEN
                RETURN 'header names must be printable text of 1 to 128 characters, not only spaces';
            END IF;
            IF jsonb_typeof(header.value) <> 'string' OR length(header.value #>> '{}') > 1024
               OR NOT queueworker.printable_text(header.value #>> '{}') THEN
                RETURN 'header values must be printable text of at most 1024 characters';
            END IF;
            header_bytes := header_bytes + queueworker.python_json_length(header.name) + 2
                            + queueworker.python_json_length(header.value #>> '{}');
        END LOOP;
        IF (SELECT count(*) FROM jsonb_object_keys(headers)) > 32 THEN
            RETURN 'headers must hold at most 32 entries';
        END IF;
        -- As Python writes them: `{"a": "1", "b": "2"}`, entries joined by `, `.
        header_bytes := header_bytes + 2 * greatest((SELECT count(*) FROM jsonb_object_keys(headers)) - 1, 0);
        IF header_bytes > 8192 THEN
            RETURN 'headers take more than 8192 bytes as JSON';
        END IF;
    END IF;
    IF key IS NOT NULL AND (length(key) NOT BETWEEN 1 AND 256 OR NOT queueworker.printable_text(key)) THEN
        RETURN 'key must be NULL or printable text of 1 to 256 characters';
    END IF;
    IF run_after IS NOT NULL AND run_after NOT BETWEEN '0002-01-01 00:00:00+00' AND '9999-12-30 00:00:00+00' THEN
        RETURN 'run_after must lie from 0002-01-01 to 9999-12-30 (UTC)';
    END IF;
    IF run_after IS NOT NULL AND delay IS NOT NULL THEN
        RETURN 'give run_after or delay, not both';
    END IF;
    IF dedupe_key IS NOT NULL AND dedupe IS NOT NULL THEN
        RETURN 'give dedupe_key or dedupe => ''spec'', not both';
    END IF;
    IF on_conflict = 'replace' AND dedupe_key IS NULL AND dedupe IS NULL THEN
        RETURN 'on_conflict => ''replace'' needs a dedupe_key or dedupe => ''spec''';
    END IF;
    IF cardinality(depends_on) <> (SELECT count(DISTINCT d.id) FROM unnest(depends_on) AS d(id)) THEN
        RETURN 'depends_on lists a task twice';
    END IF;
    RETURN NULL;
END
$_$;

CREATE FUNCTION queueworker.task_status(id bigint) RETURNS TABLE(queue text, task text, state text, attempts integer, max_attempts integer, result jsonb, error jsonb, progress jsonb, key text, created_at timestamp with time zone, run_after timestamp with time zone, started_at timestamp with time zone, finished_at timestamp with time zone)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
    SELECT t.queue, t.task, t.state::text, t.attempts, t.max_attempts, t.result, t.error, t.progress, t.key,
           t.created_at, t.run_after, t.started_at, t.finished_at
    FROM queueworker.tasks t
    WHERE t.id = $1 AND t.queue LIKE ANY ((SELECT queueworker.queue_patterns())::text[])
$_$;

CREATE FUNCTION queueworker.transition_detail(attempts integer, new_error jsonb, old_error jsonb) RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
        'attempts', attempts,
        'error', CASE WHEN new_error IS DISTINCT FROM old_error THEN new_error OPERATOR(pg_catalog.->) 'message' END,
        'error_type', CASE WHEN new_error IS DISTINCT FROM old_error THEN new_error OPERATOR(pg_catalog.->) 'type' END))
$$;

CREATE FUNCTION queueworker.unbound_by_grants() RETURNS boolean
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN NOT EXISTS (SELECT FROM queueworker.queue_grants)
        OR EXISTS (SELECT FROM pg_roles r
                   WHERE (r.oid = (SELECT nspowner FROM pg_namespace WHERE nspname = 'queueworker')
                          OR r.rolname IN ('queueworker_worker', 'queueworker_controller', 'queueworker_operator'))
                     AND pg_has_role(session_user, r.oid, 'MEMBER'));
END
$$;

CREATE FUNCTION queueworker.wake_queue(queue text, earliest timestamp with time zone) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pg_catalog.pg_notify('queueworker', CASE WHEN earliest <= now() THEN queue
                                                     ELSE queue || ' ' || extract(epoch FROM earliest)::text END);
END
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

CREATE TABLE queueworker.key_state (
    queue text NOT NULL,
    key text NOT NULL,
    tokens double precision,
    tokens_at timestamp with time zone,
    next_token_at timestamp with time zone,
    breaker_state text DEFAULT 'closed'::text NOT NULL,
    breaker_changed_at timestamp with time zone,
    failure_streak integer DEFAULT 0 NOT NULL,
    last_success_at timestamp with time zone,
    last_failure_at timestamp with time zone,
    active_minute timestamp with time zone GENERATED ALWAYS AS (
CASE
    WHEN isfinite(GREATEST(tokens_at, breaker_changed_at, last_success_at, last_failure_at)) THEN date_bin('00:01:00'::interval, GREATEST(tokens_at, breaker_changed_at, last_success_at, last_failure_at), '2000-01-01 00:00:00+00'::timestamp with time zone)
    ELSE COALESCE(GREATEST(tokens_at, breaker_changed_at, last_success_at, last_failure_at), '-infinity'::timestamp with time zone)
END) STORED NOT NULL,
    CONSTRAINT key_state_breaker_state_check CHECK ((breaker_state = ANY (ARRAY['closed'::text, 'open'::text, 'half_open'::text]))),
    CONSTRAINT key_state_failure_streak_check CHECK ((failure_streak >= 0))
)
WITH (fillfactor='50');

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
    weight double precision,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    rate_per_second double precision,
    burst integer,
    max_running integer,
    paused_until timestamp with time zone,
    CONSTRAINT queue_keys_burst_check CHECK (((burst >= 1) AND (burst <= 1000000))),
    CONSTRAINT queue_keys_burst_with_rate CHECK (((rate_per_second IS NULL) = (burst IS NULL))),
    CONSTRAINT queue_keys_key_text CHECK ((((length(key) >= 1) AND (length(key) <= 256)) AND (key !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]'::text))),
    CONSTRAINT queue_keys_max_running_check CHECK (((max_running >= 1) AND (max_running <= 1000000))),
    CONSTRAINT queue_keys_queue_check CHECK (((length(queue) >= 1) AND (length(queue) <= 200))),
    CONSTRAINT queue_keys_rate_per_second_check CHECK (((rate_per_second > (0)::double precision) AND (rate_per_second <= ('1000000'::numeric)::double precision))),
    CONSTRAINT queue_keys_some_setting CHECK (((weight IS NOT NULL) OR (rate_per_second IS NOT NULL) OR (max_running IS NOT NULL) OR (paused_until IS NOT NULL))),
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
    keyed boolean DEFAULT false NOT NULL,
    key_rate_per_second double precision,
    key_burst integer,
    key_max_running integer,
    key_limits boolean DEFAULT false NOT NULL,
    key_breaker_failures integer,
    key_breaker_cooldown_seconds double precision,
    limited boolean GENERATED ALWAYS AS (((paused_until IS NOT NULL) OR (rate_per_second IS NOT NULL) OR (max_running IS NOT NULL) OR (breaker_failures IS NOT NULL) OR (key_rate_per_second IS NOT NULL) OR (key_max_running IS NOT NULL) OR key_limits OR (key_breaker_failures IS NOT NULL))) STORED,
    key_limited boolean GENERATED ALWAYS AS (((key_rate_per_second IS NOT NULL) OR (key_max_running IS NOT NULL) OR key_limits OR (key_breaker_failures IS NOT NULL))) STORED,
    CONSTRAINT queues_breaker_cooldown_seconds_check CHECK (((breaker_cooldown_seconds > (0)::double precision) AND (breaker_cooldown_seconds <= (31536000)::double precision))),
    CONSTRAINT queues_breaker_failures_check CHECK (((breaker_failures >= 1) AND (breaker_failures <= 1000000))),
    CONSTRAINT queues_breaker_state_check CHECK ((breaker_state = ANY (ARRAY['closed'::text, 'open'::text, 'half_open'::text]))),
    CONSTRAINT queues_burst_check CHECK (((burst >= 1) AND (burst <= 1000000))),
    CONSTRAINT queues_check CHECK (((rate_per_second IS NULL) = (burst IS NULL))),
    CONSTRAINT queues_check1 CHECK (((breaker_failures IS NULL) = (breaker_cooldown_seconds IS NULL))),
    CONSTRAINT queues_key_breaker_cooldown_seconds_check CHECK (((key_breaker_cooldown_seconds > (0)::double precision) AND (key_breaker_cooldown_seconds <= (31536000)::double precision))),
    CONSTRAINT queues_key_breaker_failures_check CHECK (((key_breaker_failures >= 1) AND (key_breaker_failures <= 1000000))),
    CONSTRAINT queues_key_breaker_with_cooldown CHECK (((key_breaker_failures IS NULL) = (key_breaker_cooldown_seconds IS NULL))),
    CONSTRAINT queues_key_burst_check CHECK (((key_burst >= 1) AND (key_burst <= 1000000))),
    CONSTRAINT queues_key_burst_with_rate CHECK (((key_rate_per_second IS NULL) = (key_burst IS NULL))),
    CONSTRAINT queues_key_max_running_check CHECK (((key_max_running >= 1) AND (key_max_running <= 1000000))),
    CONSTRAINT queues_key_rate_per_second_check CHECK (((key_rate_per_second > (0)::double precision) AND (key_rate_per_second <= ('1000000'::numeric)::double precision))),
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

ALTER TABLE ONLY queueworker.key_state
    ADD CONSTRAINT key_state_pkey PRIMARY KEY (queue, key);

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

CREATE INDEX key_state_active_minute ON queueworker.key_state USING btree (active_minute);

CREATE INDEX key_state_breakers ON queueworker.key_state USING btree (queue, key) WHERE (breaker_state <> 'closed'::text);

CREATE INDEX key_state_waiting ON queueworker.key_state USING btree (queue, next_token_at) WHERE (next_token_at IS NOT NULL);

CREATE INDEX queue_events_at ON queueworker.queue_events USING btree (at);

CREATE INDEX queue_events_queue ON queueworker.queue_events USING btree (queue, id);

CREATE INDEX queue_keys_paused ON queueworker.queue_keys USING btree (queue, paused_until) WHERE (paused_until IS NOT NULL);

CREATE INDEX queue_keys_rates ON queueworker.queue_keys USING btree (queue, rate_per_second) WHERE (rate_per_second IS NOT NULL);

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

CREATE INDEX tasks_active_keys ON queueworker.tasks_active USING btree (queue, key) WHERE (key IS NOT NULL);

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

CREATE INDEX tasks_running_keys ON queueworker.tasks_active USING btree (queue, key) WHERE ((state = 'running'::queueworker.task_state) AND (fair_tag IS NOT NULL));

CREATE INDEX tasks_spec_hash ON queueworker.tasks_finished USING btree (spec_hash);

CREATE INDEX tasks_waiting ON queueworker.tasks_active USING btree (run_after) WHERE ((state = 'retrying'::queueworker.task_state) OR ((state = 'pending'::queueworker.task_state) AND delayed));

ALTER INDEX queueworker.tasks_pkey ATTACH PARTITION queueworker.tasks_active_pkey;

ALTER INDEX queueworker.tasks_run ATTACH PARTITION queueworker.tasks_active_run_id_run_partition_idx;

ALTER INDEX queueworker.tasks_pkey ATTACH PARTITION queueworker.tasks_finished_pkey;

ALTER INDEX queueworker.tasks_run ATTACH PARTITION queueworker.tasks_finished_run_id_run_partition_idx;

CREATE TRIGGER key_state_audit_breaker_insert AFTER INSERT ON queueworker.key_state FOR EACH ROW WHEN ((new.breaker_state <> 'closed'::text)) EXECUTE FUNCTION queueworker.audit_key_breaker();

CREATE TRIGGER key_state_audit_breaker_update AFTER UPDATE ON queueworker.key_state FOR EACH ROW WHEN ((old.breaker_state IS DISTINCT FROM new.breaker_state)) EXECUTE FUNCTION queueworker.audit_key_breaker();

CREATE TRIGGER queue_events_append_only BEFORE UPDATE ON queueworker.queue_events FOR EACH ROW EXECUTE FUNCTION queueworker.forbid_event_updates();

CREATE TRIGGER queue_events_no_truncate BEFORE TRUNCATE ON queueworker.queue_events FOR EACH STATEMENT EXECUTE FUNCTION queueworker.forbid_event_updates();

CREATE TRIGGER queue_keys_audit AFTER INSERT OR DELETE OR UPDATE ON queueworker.queue_keys FOR EACH ROW EXECUTE FUNCTION queueworker.audit_queue_key();

CREATE TRIGGER queue_keys_note_limits AFTER INSERT OR DELETE OR UPDATE ON queueworker.queue_keys FOR EACH ROW EXECUTE FUNCTION queueworker.note_key_limits();

CREATE TRIGGER queue_keys_removed_retag AFTER DELETE ON queueworker.queue_keys FOR EACH ROW WHEN ((old.paused_until IS NOT NULL)) EXECUTE FUNCTION queueworker.retag_resumed_key();

CREATE TRIGGER queue_keys_resumed_retag AFTER UPDATE ON queueworker.queue_keys FOR EACH ROW WHEN (((old.paused_until IS NOT NULL) AND (new.paused_until IS NULL))) EXECUTE FUNCTION queueworker.retag_resumed_key();

CREATE TRIGGER queues_audit_insert AFTER INSERT OR DELETE ON queueworker.queues FOR EACH ROW EXECUTE FUNCTION queueworker.audit_queue();

CREATE TRIGGER queues_audit_update AFTER UPDATE ON queueworker.queues FOR EACH ROW WHEN ((((((((((((((old.paused_until IS DISTINCT FROM new.paused_until) OR (old.rate_per_second IS DISTINCT FROM new.rate_per_second)) OR (old.burst IS DISTINCT FROM new.burst)) OR (old.max_running IS DISTINCT FROM new.max_running)) OR (old.breaker_failures IS DISTINCT FROM new.breaker_failures)) OR (old.breaker_cooldown_seconds IS DISTINCT FROM new.breaker_cooldown_seconds)) OR (old.breaker_state IS DISTINCT FROM new.breaker_state)) OR (old.key_rate_per_second IS DISTINCT FROM new.key_rate_per_second)) OR (old.key_burst IS DISTINCT FROM new.key_burst)) OR (old.key_max_running IS DISTINCT FROM new.key_max_running)) OR (old.key_breaker_failures IS DISTINCT FROM new.key_breaker_failures)) OR (old.key_breaker_cooldown_seconds IS DISTINCT FROM new.key_breaker_cooldown_seconds)) OR ((NOT old.keyed) AND new.keyed))) EXECUTE FUNCTION queueworker.audit_queue();

CREATE TRIGGER queues_keyed_when_key_limited AFTER INSERT OR UPDATE ON queueworker.queues FOR EACH ROW WHEN ((new.key_limited AND (NOT new.keyed))) EXECUTE FUNCTION queueworker.key_limited_queue_keyed();

CREATE TRIGGER run_events_append_only BEFORE UPDATE ON queueworker.run_events FOR EACH ROW EXECUTE FUNCTION queueworker.forbid_event_updates();

CREATE TRIGGER run_events_no_truncate BEFORE TRUNCATE ON queueworker.run_events FOR EACH STATEMENT EXECUTE FUNCTION queueworker.forbid_event_updates();

CREATE TRIGGER runs_audit_insert AFTER INSERT ON queueworker.runs FOR EACH ROW EXECUTE FUNCTION queueworker.audit_run();

CREATE TRIGGER runs_audit_update AFTER UPDATE ON queueworker.runs FOR EACH ROW WHEN (((old.state IS DISTINCT FROM new.state) OR (old.success_task_id IS DISTINCT FROM new.success_task_id) OR (old.failure_task_id IS DISTINCT FROM new.failure_task_id))) EXECUTE FUNCTION queueworker.audit_run();

CREATE TRIGGER task_events_append_only BEFORE UPDATE ON queueworker.task_events FOR EACH ROW EXECUTE FUNCTION queueworker.forbid_event_updates();

CREATE TRIGGER task_events_no_truncate BEFORE TRUNCATE ON queueworker.task_events FOR EACH STATEMENT EXECUTE FUNCTION queueworker.forbid_event_updates();

CREATE TRIGGER tasks_active_audit_insert AFTER INSERT ON queueworker.tasks_active REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION queueworker.audit_task_inserts();

CREATE TRIGGER tasks_active_claims_blind_to_key_limits BEFORE UPDATE ON queueworker.tasks_active FOR EACH ROW WHEN (((old.state = 'pending'::queueworker.task_state) AND (new.state = 'running'::queueworker.task_state) AND (old.fair_tag IS NOT NULL) AND ((new.fair_tag IS NULL) OR (new.fair_tag > (0)::double precision) OR (current_setting('queueworker.blind_key_claim'::text, true) = 'on'::text)))) EXECUTE FUNCTION queueworker.refuse_claims_blind_to_key_limits();

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

REVOKE ALL ON FUNCTION queueworker.audit_key_breaker() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.audit_queue() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.audit_queue_key() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.audit_run() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.claim_fair_tasks(queue_name text, claim_limit integer, worker_id uuid, lease_seconds double precision, default_timeout_seconds double precision, commit_without_waiting boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.claim_tasks(queue_name text, claim_limit integer, worker_id uuid, lease_seconds double precision, default_timeout_seconds double precision, commit_without_waiting boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.clean_finished(retention_seconds double precision, batch integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.clean_finished(lock_key bigint, retention_seconds double precision, batch integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.clean_key_state(retention_seconds double precision, batch integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.clean_queue_events(retention_seconds double precision, batch integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.clean_runs(retention_seconds double precision, batch integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.clean_watermarks(retention_seconds double precision, batch integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.count_run_outcomes(ids bigint[], run_ids bigint[], partitions integer[], old_states text[], new_states text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.enqueue(task text, payload jsonb, queue text, priority bigint, run_after timestamp with time zone, delay double precision, max_attempts bigint, timeout_seconds bigint, dedupe_key text, dedupe text, on_conflict text, key text, depends_on bigint[], on_dependency_failure text, headers jsonb, notify_on_finish boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.enqueue_checked_specs(queues text[], tasks text[], payloads jsonb[], priorities integer[], run_afters timestamp with time zone[], max_attempts integer[], timeouts integer[], dedupe_keys text[], by_spec boolean[], cancel_on_failure boolean[], prerequisite_ords bigint[], prerequisite_ids bigint[], headers jsonb[], keys text[], replace_duplicates boolean[], notify boolean[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.enqueue_many(specs jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.enqueue_tasks(queues text[], tasks text[], payloads jsonb[], priorities integer[], run_afters timestamp with time zone[], max_attempts integer[], timeouts integer[], dedupe_keys text[], by_spec boolean[], cancel_on_failure boolean[], prerequisite_ords bigint[], prerequisite_ids bigint[], run_ids bigint[], run_partitions integer[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.enqueue_tasks(queues text[], tasks text[], payloads jsonb[], priorities integer[], run_afters timestamp with time zone[], max_attempts integer[], timeouts integer[], dedupe_keys text[], by_spec boolean[], cancel_on_failure boolean[], prerequisite_ords bigint[], prerequisite_ids bigint[], run_ids bigint[], run_partitions integer[], headers jsonb[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.enqueue_tasks(queues text[], tasks text[], payloads jsonb[], priorities integer[], run_afters timestamp with time zone[], max_attempts integer[], timeouts integer[], dedupe_keys text[], by_spec boolean[], cancel_on_failure boolean[], prerequisite_ords bigint[], prerequisite_ids bigint[], run_ids bigint[], run_partitions integer[], headers jsonb[], keys text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.existing_tasks(ords bigint[], queues text[], dedupe_keys text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.fair_tag_inserts() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.fair_tag_updates() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.finalize_run(run_id bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.grant_queue(grantee text, pattern text) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.key_capacity(queue_name text, sample integer, task_seconds double precision) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.key_limited_queue_keyed() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.lock_key_limited_queue(queue_name text) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.lock_key_limited_queue(queue_name text, knows_key_breakers boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.make_keyed(queues text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.mark_notify_on_finish(ids bigint[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.note_key_limits() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.notify_finished() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.printable_text(value text) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.python_json_length(value text) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.queue_patterns() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.refuse_claims_blind_to_key_limits() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.replace_pending(ids bigint[], payloads jsonb[], priorities integer[], run_afters timestamp with time zone[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.require_queues(queues text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.retag_resumed_key() FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.retention_cutoff(retention_seconds double precision, batch integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.revoke_queue(grantee text, pattern text) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.settle_dependents(prerequisites bigint[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.settle_dependents(prerequisites bigint[], succeeded bigint[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.spec_field(spec jsonb, spec_position bigint, field text, kind text, fallback jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.start_run(name text, expected integer, on_success jsonb, on_failure jsonb, watermark text) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.start_run(name text, expected integer, on_success jsonb, on_failure jsonb, watermark text, queues text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.tag_fair(ids bigint[], stale bigint[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.task_spec_problem(task text, payload jsonb, queue text, priority bigint, run_after timestamp with time zone, delay double precision, max_attempts bigint, timeout_seconds bigint, dedupe_key text, dedupe text, on_conflict text, key text, depends_on bigint[], on_dependency_failure text, headers jsonb, notify_on_finish boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.task_status(id bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION queueworker.unbound_by_grants() FROM PUBLIC;
