-- The worker's background duties that keep the queue moving and the history bounded: rescue,
-- promote, clean. Every worker runs them; each statement first locks its duty's row of
-- queueworker.duty_locks (migrations 013 and 017) for its transaction, SKIP LOCKED, so one worker
-- at a time does the work and the others change nothing. Only roles granted UPDATE on that table can lock its rows: a login without grants can
-- hold no duty up, as it could an advisory key.
-- Each statement is declared, with its parameter and row types, in queueworker.db.duties.

-- name: rescue
-- Rescuer: returns tasks whose lease expired (or whose hard deadline passed `deadline_grace`
-- seconds ago) to the queue, or fails them when their attempts are spent, wakes the queues they
-- return to, and forgets workers whose last heartbeat is older than `worker_ttl` seconds. Rows a
-- completion is writing are locked, and skipped: a rescue never races a completion.
WITH guard AS MATERIALIZED (
    SELECT count(*) > 0 AS held FROM (
        SELECT FROM queueworker.duty_locks WHERE duty = 'rescue' FOR NO KEY UPDATE SKIP LOCKED) AS duty
), expired AS (
    SELECT t.id FROM queueworker.tasks t, guard
    WHERE guard.held AND t.state = 'running'
      AND (t.leased_until < now() OR t.deadline_at < now() - make_interval(secs => %(deadline_grace)s))
    ORDER BY t.id
    LIMIT %(limit)s
    FOR NO KEY UPDATE OF t SKIP LOCKED
), rescued AS (
    UPDATE queueworker.tasks t
    SET state = CASE WHEN t.attempts >= t.max_attempts THEN 'failed' ELSE 'pending' END::queueworker.task_state,
        error = jsonb_build_object(
            'type', CASE WHEN t.leased_until < now() THEN 'LeaseExpired' ELSE 'DeadlineExceeded' END,
            'message', CASE WHEN t.leased_until < now()
                            THEN 'lease expired: worker ' || t.lease_owner::text || ' stopped heartbeating'
                            ELSE 'hard deadline exceeded while the worker still held the lease' END,
            'retryable', t.attempts < t.max_attempts),
        rescues = t.rescues + 1, run_after = now(), updated_at = now(),
        finished_at = CASE WHEN t.attempts >= t.max_attempts THEN now() END,
        lease_owner = NULL, leased_until = NULL, deadline_at = NULL
    FROM expired
    WHERE t.id = expired.id AND t.state = 'running'
    RETURNING t.id, t.queue, t.state
), reaped AS (
    DELETE FROM queueworker.workers w
    USING guard
    WHERE guard.held AND w.heartbeat_at < now() - make_interval(secs => %(worker_ttl)s)
    RETURNING w.id
), notified AS (
    SELECT pg_notify('queueworker', queue) FROM rescued WHERE state = 'pending' GROUP BY queue
)
SELECT (SELECT held FROM guard) AS held,
       (SELECT count(*) FROM rescued WHERE state = 'pending') AS requeued,
       (SELECT count(*) FROM rescued WHERE state = 'failed') AS failed,
       (SELECT count(*) FROM reaped) AS reaped,
       (SELECT count(*) FROM notified) AS notified;

-- name: promote_due
-- Scheduler: admits tasks whose time has come to the claim index (retrying -> pending when the
-- backoff is over; delayed pending tasks when due), wakes their queues, and says when the next
-- one is due so it can sleep exactly that long. Admitting a delayed task is no change of state,
-- so it writes no audit row.
WITH guard AS MATERIALIZED (
    SELECT count(*) > 0 AS held FROM (
        SELECT FROM queueworker.duty_locks WHERE duty = 'promote_due' FOR NO KEY UPDATE SKIP LOCKED) AS duty
), due AS (
    SELECT t.id FROM queueworker.tasks t, guard
    WHERE guard.held AND (t.state = 'retrying' OR (t.state = 'pending' AND t.delayed)) AND t.run_after <= now()
    ORDER BY t.run_after
    LIMIT %(limit)s
    FOR NO KEY UPDATE OF t SKIP LOCKED
), promoted AS (
    UPDATE queueworker.tasks t SET state = 'pending', delayed = false, updated_at = now()
    FROM due WHERE t.id = due.id AND t.state IN ('retrying', 'pending')
    RETURNING t.queue
), notified AS (
    SELECT pg_notify('queueworker', queue) FROM promoted GROUP BY queue
)
SELECT (SELECT count(*) FROM promoted) AS promoted,
       (SELECT count(*) FROM notified) AS notified,
       (SELECT extract(epoch FROM min(run_after) - now())::float8
        FROM queueworker.tasks WHERE state = 'retrying' OR (state = 'pending' AND delayed)) AS next_due_in;

-- name: clean_finished
-- Cleaner: deletes finished tasks (and their audit rows) older than the retention, oldest first,
-- in batches, so history never grows without bound. Each of the cleaner's statements runs a
-- SECURITY DEFINER function (migrations/functions/80_retention.sql), which locks the duty's row of
-- queueworker.duty_locks itself: the worker role may run them, but holds no DELETE on the history
-- or the audit trails (docs/security.md).
SELECT id FROM queueworker.clean_finished(%(retention_seconds)s::float8, %(limit)s::integer)
    AS deleted(id);

-- name: clean_runs
-- Cleaner: deletes finished runs (and their run_events) that ended before the retention, once none
-- of their tasks remain (clean_finished deletes those first) and no watermark names them as the run
-- that last advanced it.
SELECT id FROM queueworker.clean_runs(%(retention_seconds)s::float8, %(limit)s::integer)
    AS deleted(id);

-- name: clean_queue_events
-- Cleaner: deletes queue events (who changed a queue's flow control, and the breaker's moves)
-- older than the retention.
SELECT id FROM queueworker.clean_queue_events(%(retention_seconds)s::float8, %(limit)s::integer)
    AS deleted(id);

-- name: clean_watermarks
-- Cleaner: deletes watermarks last advanced before the watermark retention (their own, longer one)
-- that no running run will advance; returns their names for the log.
SELECT name FROM queueworker.clean_watermarks(%(retention_seconds)s::float8, %(limit)s::integer)
    AS deleted(name);

-- name: clean_key_state
-- Cleaner: deletes the state of keys idle for the retention (their bucket, breaker and health in
-- queueworker.key_state: no unfinished task, no change for that long), when deleting it changes
-- nothing a claim decides (a full bucket; a closed breaker, or one whose cooldown is over); returns
-- the queue of each. The keys' settings (queue_keys) stay.
SELECT queue FROM queueworker.clean_key_state(%(retention_seconds)s::float8, %(limit)s::integer)
    AS deleted(queue);
