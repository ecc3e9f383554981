-- Periodic tasks (migration 011): the cron duty (queueworker.runtime.cron) and the runtime schedules of
-- queueworker.client.cron (`queueworker cron`).
-- Each statement is declared, with its parameter and row types, in queueworker/db/cron.py.
--
-- Workers' cron duties look at the schedules again when told on the channel queueworker_cron (payload:
-- the schedule's name), by every statement that adds, changes, pauses, resumes or deletes one: each is
-- the change in a CTE `changed`, then a pg_notify per changed schedule. Moving a schedule's next slot on
-- (enqueue_cron_slots) tells nobody: it only makes the schedule due later.

-- name: database_now
-- Slots are computed against the database's clock, never a worker's or the CLI's own.
SELECT now();

-- name: upsert_code_cron_job
-- A schedule declared in code, written by every worker at start: created with its first slot, or changed
-- in place; its next slot moves only when its expression or time zone changed (it is then the new first
-- slot). A runtime schedule of the same name is left alone (it wins), and so is one that would not change:
-- no row comes back then.
WITH changed AS (
    INSERT INTO queueworker.cron_jobs AS j (name, expression, timezone, task, payload, queue, priority, max_attempts,
                                           catch_up, source, next_slot, key)
    VALUES (%(name)s, %(expression)s, %(timezone)s, %(task)s, %(payload)s::jsonb, %(queue)s, %(priority)s,
            %(max_attempts)s, %(catch_up)s, 'code', %(first_slot)s, %(key)s)
    ON CONFLICT (name) DO UPDATE
    SET expression = excluded.expression, timezone = excluded.timezone, task = excluded.task,
        payload = excluded.payload, queue = excluded.queue, priority = excluded.priority,
        max_attempts = excluded.max_attempts, catch_up = excluded.catch_up, key = excluded.key, updated_at = now(),
        next_slot = CASE WHEN (j.expression, j.timezone) IS DISTINCT FROM (excluded.expression, excluded.timezone)
                         THEN excluded.next_slot ELSE j.next_slot END
    WHERE j.source = 'code'
      AND (j.expression, j.timezone, j.task, j.payload, j.queue, j.priority, j.max_attempts, j.catch_up, j.key)
          IS DISTINCT FROM (excluded.expression, excluded.timezone, excluded.task, excluded.payload, excluded.queue,
                            excluded.priority, excluded.max_attempts, excluded.catch_up, excluded.key)
    RETURNING name, (xmax = 0) AS created
), told AS (
    SELECT pg_notify('queueworker_cron', name) FROM changed
)
SELECT created FROM changed, (SELECT count(*) FROM told) AS t;

-- name: upsert_runtime_cron_job
-- `cron add`: the same for a runtime schedule, which leaves one declared in code alone.
WITH changed AS (
    INSERT INTO queueworker.cron_jobs AS j (name, expression, timezone, task, payload, queue, priority, max_attempts,
                                           catch_up, source, next_slot, key)
    VALUES (%(name)s, %(expression)s, %(timezone)s, %(task)s, %(payload)s::jsonb, %(queue)s, %(priority)s,
            %(max_attempts)s, %(catch_up)s, 'runtime', %(first_slot)s, %(key)s)
    ON CONFLICT (name) DO UPDATE
    SET expression = excluded.expression, timezone = excluded.timezone, task = excluded.task,
        payload = excluded.payload, queue = excluded.queue, priority = excluded.priority,
        max_attempts = excluded.max_attempts, catch_up = excluded.catch_up, key = excluded.key, updated_at = now(),
        next_slot = CASE WHEN (j.expression, j.timezone) IS DISTINCT FROM (excluded.expression, excluded.timezone)
                         THEN excluded.next_slot ELSE j.next_slot END
    WHERE j.source = 'runtime'
      AND (j.expression, j.timezone, j.task, j.payload, j.queue, j.priority, j.max_attempts, j.catch_up, j.key)
          IS DISTINCT FROM (excluded.expression, excluded.timezone, excluded.task, excluded.payload, excluded.queue,
                            excluded.priority, excluded.max_attempts, excluded.catch_up, excluded.key)
    RETURNING name, (xmax = 0) AS created
), told AS (
    SELECT pg_notify('queueworker_cron', name) FROM changed
)
SELECT created FROM changed, (SELECT count(*) FROM told) AS t;

-- name: runtime_cron_jobs_among
-- Which of the schedules a worker declares in code are shadowed by runtime ones (it logs them).
SELECT name FROM queueworker.cron_jobs WHERE name = ANY(%(names)s::text[]) AND source = 'runtime' ORDER BY name;

-- name: due_cron_jobs
-- The schedules with a slot due within %(ahead)s seconds, and the database's clock, which every
-- worker computes slots against (never its own); not those this worker skips for a while (they
-- could not be computed or enqueued), which would otherwise fill the batch.
SELECT name, expression, timezone, catch_up, next_slot, now() AS now
FROM queueworker.cron_jobs
WHERE NOT paused AND next_slot <= now() + make_interval(secs => %(ahead)s) AND name <> ALL(%(skipped)s::text[])
ORDER BY next_slot
LIMIT %(limit)s;

-- name: next_cron_slot_in
-- How long the cron duty may sleep when nothing is due (the schedules it skips for a while aside).
SELECT extract(epoch FROM min(next_slot) - now())::float8 AS next_in
FROM queueworker.cron_jobs WHERE NOT paused AND name <> ALL(%(skipped)s::text[]);

-- name: enqueue_cron_slots
-- Enqueues a schedule's slots in the statement that moves its next slot on, and only if the
-- schedule still is what the worker computed them from (compare-and-set on next_slot, expression
-- and time zone): a second worker with the same slots waits for the first one's row lock, finds
-- next_slot moved, and changes nothing. The task itself comes from the row as it is now. Each slot
-- is one task due at the slot (a delayed one until then), with the dedupe key 'cron:NAME:<slot>' and
-- the schedule's task key (migration 018), through queueworker.enqueue_tasks (migration 006), which
-- also wakes the queue. A slot at or before
-- the last one enqueued is never enqueued again: a schedule whose expression and queue changed
-- together starts again from its new first slot, and the key (unique per queue) would not catch
-- the same slot in the new queue. (Every CTE reads the row as it was before `advanced` changed it.)
WITH before AS (
    SELECT last_enqueued_slot FROM queueworker.cron_jobs WHERE name = %(name)s
), advanced AS (
    UPDATE queueworker.cron_jobs
    SET next_slot = %(next_slot)s,
        last_enqueued_slot = greatest(%(last_slot)s::timestamptz, last_enqueued_slot), updated_at = now()
    WHERE name = %(name)s AND next_slot = %(seen)s AND expression = %(expression)s AND timezone = %(timezone)s
      AND NOT paused
    RETURNING queue, task, payload, priority, max_attempts, key
), fresh AS (
    SELECT coalesce(array_agg(s.slot ORDER BY s.slot), '{}') AS slots,
           coalesce(array_agg(s.dedupe_key ORDER BY s.slot), '{}') AS dedupe_keys
    FROM before b, unnest(%(slots)s::timestamptz[], %(dedupe_keys)s::text[]) AS s(slot, dedupe_key)
    WHERE s.slot > coalesce(b.last_enqueued_slot, '-infinity')
), enqueued AS (
    SELECT e.id
    FROM advanced a, fresh f, cardinality(f.slots) AS n,
         queueworker.enqueue_tasks(array_fill(a.queue, ARRAY[n]), array_fill(a.task, ARRAY[n]),
                                   array_fill(a.payload, ARRAY[n]), array_fill(a.priority, ARRAY[n]),
                                   f.slots, array_fill(a.max_attempts, ARRAY[n]), '{}'::int[],
                                   f.dedupe_keys, '{}'::bool[], '{}'::bool[], '{}'::bigint[],
                                   '{}'::bigint[], '{}'::bigint[], '{}'::int[], '{}'::jsonb[],
                                   array_fill(a.key, ARRAY[n])) AS e
    WHERE n > 0
)
SELECT (SELECT count(*) FROM advanced) AS advanced, (SELECT count(id) FROM enqueued) AS enqueued;

-- name: cron_jobs
-- `cron list`: every schedule, the payload as JSON text (decoded where it is shown).
SELECT name, expression, timezone, task, payload::text AS payload_json, queue, priority, max_attempts,
       catch_up, paused, source, next_slot, last_enqueued_slot, created_at, updated_at, key
FROM queueworker.cron_jobs ORDER BY name;

-- name: cron_schedule_for_update
-- `cron resume` reads the schedule, locked (its next slot is computed from it), and the database's clock,
-- in its transaction.
SELECT expression, timezone, now() AS now FROM queueworker.cron_jobs WHERE name = %(name)s FOR UPDATE;

-- name: pause_cron_job
-- No row: no schedule of that name.
WITH changed AS (
    UPDATE queueworker.cron_jobs SET paused = true, updated_at = now() WHERE name = %(name)s RETURNING name
), told AS (
    SELECT pg_notify('queueworker_cron', name) FROM changed
)
SELECT name FROM changed, (SELECT count(*) FROM told) AS t;

-- name: resume_cron_job
-- Resuming starts from the first slot after now: slots of the pause are not caught up. No row: the
-- schedule was not paused.
WITH changed AS (
    UPDATE queueworker.cron_jobs SET paused = false, next_slot = %(next_slot)s, updated_at = now()
    WHERE name = %(name)s AND paused RETURNING name
), told AS (
    SELECT pg_notify('queueworker_cron', name) FROM changed
)
SELECT name FROM changed, (SELECT count(*) FROM told) AS t;

-- name: cron_job_source
-- Why `cron add` changed nothing: a schedule declared in code holds the name, or it was the same already.
SELECT source FROM queueworker.cron_jobs WHERE name = %(name)s;

-- name: delete_cron_job
-- No row: no schedule of that name. One declared in code comes back when a worker declaring it starts.
WITH changed AS (
    DELETE FROM queueworker.cron_jobs WHERE name = %(name)s RETURNING name, source
), told AS (
    SELECT pg_notify('queueworker_cron', name) FROM changed
)
SELECT source FROM changed, (SELECT count(*) FROM told) AS t;
