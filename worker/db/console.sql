-- `queueworker console`: bounded reads over a history of any size (queueworker.console.data), so a page
-- costs the same on a history of ten rows or ten million. What the console shows as the CLI does
-- (a task, its events, runs, workers, queue settings) it reads through the client's statements.
-- Each statement is declared, with its parameter and row types, in queueworker/db/console.py.

-- name: set_statement_timeout
-- Every connection of the console's pool, once: no page waits on the database longer than this (in
-- milliseconds, for the session; a function, so the value can be a parameter).
SELECT set_config('statement_timeout', %(milliseconds)s, false);

-- name: queue_names
-- Every queue worth a line, at most %(limit)s: with ready, running or blocked tasks (a skip scan of
-- each partial index that leads with the queue, tasks_claim, tasks_running and tasks_blocked: one
-- probe per queue, however many tasks), with settings, worked by a live worker, with tasks finished
-- within the hour (among the newest 20,000 finished), or among the 20,000 waiting tasks (delayed or
-- retrying) due first. Neither partition is scanned whole.
WITH RECURSIVE ready(name, n) AS (
    (SELECT queue, 1 FROM queueworker.tasks_active WHERE state = 'pending' AND NOT delayed ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM queueworker.tasks_active t
            WHERE t.state = 'pending' AND NOT t.delayed AND t.queue > r.name ORDER BY t.queue LIMIT 1), r.n + 1
    FROM ready r WHERE r.name IS NOT NULL AND r.n < %(limit)s
), running(name, n) AS (
    (SELECT queue, 1 FROM queueworker.tasks_active WHERE state = 'running' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM queueworker.tasks_active t
            WHERE t.state = 'running' AND t.queue > r.name ORDER BY t.queue LIMIT 1), r.n + 1
    FROM running r WHERE r.name IS NOT NULL AND r.n < %(limit)s
), blocked(name, n) AS (
    (SELECT queue, 1 FROM queueworker.tasks_active WHERE state = 'blocked' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM queueworker.tasks_active t
            WHERE t.state = 'blocked' AND t.queue > r.name ORDER BY t.queue LIMIT 1), r.n + 1
    FROM blocked r WHERE r.name IS NOT NULL AND r.n < %(limit)s
)
SELECT name FROM (
    SELECT name FROM ready UNION SELECT name FROM running UNION SELECT name FROM blocked
    UNION SELECT queue FROM (SELECT queue FROM queueworker.tasks_active
                             WHERE state = 'retrying' OR (state = 'pending' AND delayed)
                             ORDER BY run_after LIMIT 20000) AS w
    UNION SELECT name FROM queueworker.queues
    UNION SELECT unnest(queues) FROM queueworker.workers
    UNION SELECT queue FROM (SELECT queue FROM queueworker.tasks
                             WHERE state IN ('succeeded', 'failed', 'cancelled')
                               AND finished_at > now() - interval '1 hour'
                             ORDER BY finished_at DESC LIMIT 20000) AS r
) AS n
WHERE name IS NOT NULL
ORDER BY name LIMIT %(limit)s;

-- name: finish_rates
-- Finished tasks per queue and outcome over the last %(window)s seconds: the newest 20,000 of them, and
-- the seconds that sample covers (the whole window unless it filled).
WITH recent AS MATERIALIZED (
    SELECT queue, state, finished_at FROM queueworker.tasks
    WHERE state IN ('succeeded', 'failed', 'cancelled') AND finished_at > now() - make_interval(secs => %(window)s)
    ORDER BY finished_at DESC LIMIT 20000
), covered AS (
    SELECT CASE WHEN count(*) < 20000 THEN %(window)s::float8
                ELSE greatest(extract(epoch FROM now() - min(finished_at))::float8, 0.001) END AS seconds
    FROM recent
)
SELECT queue, count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE state = 'failed') AS failed, count(*) FILTER (WHERE state = 'cancelled') AS cancelled,
       (SELECT seconds FROM covered) AS seconds
FROM recent GROUP BY queue;

-- name: task_page
-- A page of tasks, newest first, below id %(before)s: the newest %(scan)s tasks of the partitions
-- holding %(partition_states)s are read through the primary key, and those matching the filters are returned
-- (at most %(limit)s, each progress cut at %(progress_chars)s characters). Every row also says how
-- many tasks were read and the lowest id among them, so a page with few matches continues below
-- what was read; one row of NULL task columns when none match.
WITH scanned AS MATERIALIZED (
    SELECT id, queue, task, state, attempts, max_attempts, progress, dedupe_key, key, lease_owner, created_at,
           updated_at
    FROM queueworker.tasks
    WHERE id < %(before)s AND state = ANY(%(partition_states)s::queueworker.task_state[])
    ORDER BY id DESC LIMIT %(scan)s
), matched AS (
    SELECT * FROM scanned
    WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
      AND (%(state)s::text IS NULL OR state = %(state)s::queueworker.task_state)
      AND (%(task)s::text IS NULL OR task = %(task)s)
      AND (%(dedupe_key)s::text IS NULL OR dedupe_key = %(dedupe_key)s)
    ORDER BY id DESC LIMIT %(limit)s
)
SELECT m.id, m.queue, m.task, m.state::text AS state, m.attempts, m.max_attempts,
       left(m.progress::text, %(progress_chars)s) AS progress_json,
       m.dedupe_key, m.key, m.lease_owner::text AS lease_owner, m.created_at, m.updated_at, s.scanned, s.lowest_scanned
FROM (SELECT count(*) AS scanned, min(id) AS lowest_scanned FROM scanned) AS s
LEFT JOIN matched m ON true
ORDER BY m.id DESC;

-- name: key_holders
-- The unfinished tasks holding a dedupe key, on any queue: one probe of tasks_dedupe per queue.
SELECT id, queue, state::text AS state FROM queueworker.tasks_active
WHERE dedupe_key = %(dedupe_key)s ORDER BY id LIMIT 100;

-- name: leases_by_worker
-- Leases held right now, per worker, with the first %(shown)s task ids, through the partial index of
-- running tasks, tasks_running (bounded by the fleet's concurrency).
SELECT lease_owner::text AS worker, count(*) AS leases, (array_agg(id ORDER BY id))[1:%(shown)s] AS task_ids
FROM queueworker.tasks WHERE state = 'running' GROUP BY lease_owner;

-- name: task_shown
-- One task, as queueworker.client.inspect reads it for `queueworker show`, but every stored value
-- cut in Postgres at %(chars)s characters, with its whole length in bytes beside it: a page never
-- carries, nor the console holds, a value of any size (a 60 MiB payload is 64 KiB on the page).
SELECT id, queue, task, state::text AS state, attempts, max_attempts, priority,
       left(payload::text, %(chars)s) AS payload_json, octet_length(payload::text) AS payload_bytes,
       left(result::text, %(chars)s) AS result_json, octet_length(result::text) AS result_bytes,
       left(error::text, %(chars)s) AS error_json, octet_length(error::text) AS error_bytes,
       left(checkpoint::text, %(chars)s) AS checkpoint_json, octet_length(checkpoint::text) AS checkpoint_bytes,
       left(headers::text, %(chars)s) AS headers_json, octet_length(headers::text) AS headers_bytes,
       left(progress::text, %(chars)s) AS progress_json, dedupe_key, key,
       run_id, run_partition, continued_from, lease_owner, created_at, run_after, started_at, finished_at, updated_at
FROM queueworker.tasks WHERE id = %(id)s;

-- name: task_events_shown
-- A task's audit trail, oldest first: its first %(limit)s events, each detail cut at %(chars)s
-- characters with its whole length in bytes (an error's message can be of any size).
SELECT at, from_state::text AS from_state, to_state::text AS to_state, worker, lease_token,
       left(detail::text, %(chars)s) AS detail_json, octet_length(detail::text) AS detail_bytes, by_user
FROM queueworker.task_events WHERE task_id = %(id)s ORDER BY id LIMIT %(limit)s;

-- name: runs_shown
-- The newest %(limit)s runs, of one name or all: what the list shows (not the watermarks, which
-- can be of any size).
SELECT id, name, state::text AS state, expected, succeeded, failed, cancelled, started_at, finished_at
FROM queueworker.runs
WHERE %(name)s::text IS NULL OR name = %(name)s ORDER BY id DESC LIMIT %(limit)s;

-- name: run_shown
-- One run, as queueworker.client.runs reads it, every stored value cut at %(chars)s characters with
-- its whole length in bytes.
SELECT id, name, state::text AS state, expected, succeeded, failed, cancelled, success_task_id,
       failure_task_id, forced, left(watermark, %(chars)s) AS watermark,
       left(watermark_before::text, %(chars)s) AS watermark_before_json,
       octet_length(watermark_before::text) AS watermark_before_bytes,
       left(watermark_after::text, %(chars)s) AS watermark_after_json,
       octet_length(watermark_after::text) AS watermark_after_bytes, started_at, finished_at
FROM queueworker.runs WHERE id = %(id)s;

-- name: run_tasks_shown
-- The run's first %(limit)s tasks, as queueworker.client.runs orders them, each error's message cut at
-- %(error_chars)s characters.
SELECT id, run_partition AS partition, state::text AS state, attempts,
       left(error ->> 'message', %(error_chars)s) AS error
FROM queueworker.tasks WHERE run_id = %(id)s ORDER BY run_partition NULLS LAST, id LIMIT %(limit)s;
