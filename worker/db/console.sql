-- `queueworker console`: bounded reads over a history of any size (queueworker.console.data), so a page
-- costs the same on a history of ten rows or ten million. What the console shows as the CLI does
-- (a task, its events, runs, workers, queue settings) it reads through the client's statements.
-- Each statement is declared, with its parameter and row types, in queueworker/db/console.py.

-- name: set_statement_timeout
-- Every connection of the console's pool, once: no page waits on the database longer than this (in
-- milliseconds, for the session; a function, so the value can be a parameter).
SELECT set_config('statement_timeout', %(milliseconds)s, false);

-- name: queue_names
-- Every queue worth a line: with unfinished tasks, with settings, worked by a live worker, or with tasks
-- finished within the hour (among the newest 20,000 finished: the history is not scanned).
SELECT name FROM (
    SELECT queue AS name FROM queueworker.tasks_active
    UNION SELECT name FROM queueworker.queues
    UNION SELECT unnest(queues) FROM queueworker.workers
    UNION SELECT queue FROM (SELECT queue FROM queueworker.tasks
                             WHERE state IN ('succeeded', 'failed', 'cancelled')
                               AND finished_at > now() - interval '1 hour'
                             ORDER BY finished_at DESC LIMIT 20000) AS r
) AS n
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
-- (at most %(limit)s). Every row also says how many tasks were read and the lowest id among them, so
-- a page with few matches continues below what was read; one row of NULL task columns when none match.
WITH scanned AS MATERIALIZED (
    SELECT id, queue, task, state, attempts, max_attempts, progress, dedupe_key, lease_owner, created_at, updated_at
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
SELECT m.id, m.queue, m.task, m.state::text AS state, m.attempts, m.max_attempts, m.progress::text AS progress_json,
       m.dedupe_key, m.lease_owner::text AS lease_owner, m.created_at, m.updated_at, s.scanned, s.lowest_scanned
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
