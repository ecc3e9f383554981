-- Partitioned runs (migrations 006 and 007): start (queueworker.client.producer), read, retry and finalize
-- (queueworker.client.runs: `queueworker runs`, `queueworker run` and the console).
-- Each statement is declared, with its parameter and row types, in queueworker/db/runs.py.

-- name: start_run
-- The run's row, through a definer function (migration 006; the queues since 016); its partitions are
-- enqueued next, in the same transaction, by enqueue_tasks with the run's id, each in one of `queues`.
SELECT queueworker.start_run(%(name)s, %(expected)s, %(on_success)s::jsonb, %(on_failure)s::jsonb,
                             %(watermark)s, %(queues)s::text[]) AS id;

-- name: runs
-- The newest runs, of one name or all. Watermarks as JSON text: one written by hand may be JSON Python
-- cannot read, and it is decoded where it is shown.
SELECT id, name, state::text AS state, expected, succeeded, failed, cancelled, success_task_id,
       failure_task_id, forced, watermark, watermark_before::text AS watermark_before_json,
       watermark_after::text AS watermark_after_json, started_at, finished_at
FROM queueworker.runs
WHERE %(name)s::text IS NULL OR name = %(name)s ORDER BY id DESC LIMIT %(limit)s;

-- name: run
-- One run, as `runs` returns them.
SELECT id, name, state::text AS state, expected, succeeded, failed, cancelled, success_task_id,
       failure_task_id, forced, watermark, watermark_before::text AS watermark_before_json,
       watermark_after::text AS watermark_after_json, started_at, finished_at
FROM queueworker.runs WHERE id = %(id)s;

-- name: run_tasks
-- The run's tasks: partitions in order, then its consolidation and alert; all of them (%(limit)s NULL)
-- for `queueworker run show`, the first %(limit)s for the console.
SELECT id, run_partition AS partition, state::text AS state, attempts, error ->> 'message' AS error
FROM queueworker.tasks WHERE run_id = %(id)s ORDER BY run_partition NULLS LAST, id LIMIT %(limit)s;

-- name: run_events
-- The run's audit trail (migration 007): one row per transition, oldest first; all of it (%(limit)s
-- NULL) for `queueworker run show`, its first %(limit)s for the console, whose page stays bounded
-- however often a run was retried. The detail is counters and ids written by audit_run: small.
SELECT at, from_state::text AS from_state, to_state::text AS to_state, detail::text AS detail_json, by_user
FROM queueworker.run_events WHERE run_id = %(id)s ORDER BY id LIMIT %(limit)s;

-- name: retry_run
-- `queueworker run retry ID`: the run's failed and cancelled partitions, as tasks.retry_task would, and
-- their queues woken.
WITH retried AS (
    UPDATE queueworker.tasks
    SET state = 'pending', delayed = false, run_after = now(), updated_at = now(), finished_at = NULL,
    max_attempts = greatest(max_attempts, attempts + 1)
    WHERE run_id = %(id)s AND run_partition IS NOT NULL AND state IN ('failed', 'cancelled')
    RETURNING id, queue
), notified AS (
    SELECT pg_notify('queueworker', queue) FROM retried GROUP BY queue
)
SELECT count(*) AS retried, (SELECT count(*) FROM notified) AS notified FROM retried;

-- name: finalize_run
-- `queueworker run finalize ID --force`: consolidates a failed run on purpose, through a definer function
-- (migration 006); false when the run is not failed, or was consolidated already.
SELECT queueworker.finalize_run(%(id)s) AS finalized;
