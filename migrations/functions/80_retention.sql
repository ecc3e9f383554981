-- queueworker functions: retention of history (finished tasks, finished runs, queue events, stale
-- watermarks) and of the state of idle keys.
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE: CREATE OR REPLACE TRIGGER cannot
-- replace a constraint trigger). A SQL-language body is checked when it is created: what it calls
-- must come from an earlier file, or from earlier in the same one. PL/pgSQL bodies are resolved
-- when they run.
--
-- Retention is the one way history is deleted, by the cleaner duty of every worker
-- (worker/runtime/cleaner.py), through the definer functions below: the worker role may EXECUTE
-- them and holds no DELETE on the history or the audit trails itself (docs/security.md). Each
-- locks its own row of queueworker.duty_locks (migrations 013 and 017) for its transaction, SKIP
-- LOCKED, so one worker at a time does each and the others delete nothing; a login without UPDATE
-- on that table cannot lock it (an advisory key could be held by anyone). Each deletes at most
-- `batch` rows, oldest first, and the caller repeats it until a batch comes back short. Each plans
-- without sequential scans, so that its work follows the batch, not the history: a worker whose
-- session keeps its plans (through a pooler, where its session settings are refused) planned them
-- while the history was small, and a batch of 1,000 then read the whole history once per row
-- (100 million rows, 12 s, at 100,000 finished tasks), until the cleaner could no longer keep up
-- (docs/architecture.md, "A generic plan must not depend on the table's size").

-- The time before which history goes: now, less `retention_seconds`. Refuses what no worker sends
-- (a retention that is negative, NaN, infinite or over 2^31 - 1 seconds, the bound of
-- WorkerSettings; a batch outside 1 to 100,000) with one line, rather than deleting everything, or
-- nothing, in silence.
CREATE OR REPLACE FUNCTION queueworker.retention_cutoff(retention_seconds float8, batch integer)
RETURNS timestamptz
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
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

-- Deletes finished tasks older than the retention, with their audit rows and their edges; returns
-- their ids. A finished prerequisite has already had its say: its dependents were settled when it
-- ended. Called by `clean_finished` (worker/db/duties.sql).
CREATE OR REPLACE FUNCTION queueworker.clean_finished(retention_seconds float8, batch integer)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
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

-- Version 12's signature, which its workers call during a rolling upgrade: the key they pass is
-- no longer a lock of any kind.
CREATE OR REPLACE FUNCTION queueworker.clean_finished(lock_key bigint, retention_seconds float8, batch integer)
RETURNS SETOF bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT queueworker.clean_finished(retention_seconds, batch)
$$;

-- Deletes finished runs (succeeded or failed) that ended before the retention, with their events
-- (run_events); returns their ids. Only once none of a run's tasks remain (clean_finished deletes
-- them first, by the same retention): a run with a task left could still move (a retry of its
-- partition, its consolidation or its alert takes it back to running), and its tasks would name a
-- run that is gone. The run that last advanced a watermark stays as long as the watermark does
-- (watermarks.run_id names it), so a watermark always shows where it came from. Nothing else
-- refers to a run. Called by `clean_runs` (worker/db/duties.sql).
CREATE OR REPLACE FUNCTION queueworker.clean_runs(retention_seconds float8, batch integer)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
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

-- Deletes queue events (the audit trail of flow control) older than the retention; returns their
-- ids. Nothing reads them back: a queue's settings and its breaker's state are in queueworker.queues,
-- whatever became of the events that recorded their changes. Called by `clean_queue_events`.
CREATE OR REPLACE FUNCTION queueworker.clean_queue_events(retention_seconds float8, batch integer)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
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

-- Deletes watermarks last advanced before the watermark retention (a retention of their own, longer
-- than the history's: a watermark that goes makes its job's next run start from nothing, so a job
-- that runs once a year must keep its own), unless a run that will advance it is running; returns
-- their names. A run that starts meanwhile read the value as it stood, and writes the watermark
-- again when it succeeds. Called by `clean_watermarks`.
CREATE OR REPLACE FUNCTION queueworker.clean_watermarks(retention_seconds float8, batch integer)
RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
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

-- Deletes the state of keys idle for the retention (queueworker.key_state, migration 023: a key's
-- bucket, breaker and health); returns the queue of each row deleted. A key is idle when it has no
-- unfinished task (tasks_active) and its row has not changed for the retention (its tokens charged,
-- its breaker moved, a success or a failure reported: the latest of those times, found through the
-- index of its minute, key_state.active_minute, migration 024). Deleting a row makes the key a new
-- one: a full bucket, a closed breaker, no health. So a row goes only when that changes nothing a claim would decide:
-- - its bucket is full again (a key with no rate now has none to keep): a key whose rate refills
--   it slower than the retention keeps its row until it has, and a claim never starts more than
--   its bucket allows;
-- - its breaker is closed, or its cooldown is over: an open breaker would let its probe through by
--   now anyway, and one whose key has had no task for the retention has nothing left to protect; a
--   breaker with a cooldown longer than the retention stays open for the whole of it.
-- A claim or a report that writes the row as it goes changes its times: the row lock makes the
-- deletion wait for it, and a row it changed is no longer idle (the lock re-reads the row), or skip
-- it. A claim that read the row before its deletion charges the bucket it read, a claim after it a
-- full one: the same, since only full buckets go. A task enqueued at that moment, unseen by the
-- deletion, finds its key new. The row of the tasks without a key (the key '') stays: one per queue.
-- The operator's settings of a key (queue_keys) are not touched. Called by `clean_key_state`.
CREATE OR REPLACE FUNCTION queueworker.clean_key_state(retention_seconds float8, batch integer)
RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
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

-- Functions are executable by PUBLIC unless revoked; these delete history.
REVOKE EXECUTE ON FUNCTION queueworker.retention_cutoff(float8, integer),
                           queueworker.clean_finished(float8, integer),
                           queueworker.clean_finished(bigint, float8, integer),
                           queueworker.clean_runs(float8, integer),
                           queueworker.clean_queue_events(float8, integer),
                           queueworker.clean_watermarks(float8, integer),
                           queueworker.clean_key_state(float8, integer) FROM PUBLIC;
