-- Reading tasks and workers back: `get_task` and `wait_for`, `queueworker show`, `list` and `status`, the
-- console and the demo (queueworker.client.inspect, .results and .status).
-- Each statement is declared, with its parameter and row types, in queueworker/db/inspect.py.

-- name: task
-- One task, for `get_task` and `queueworker show`. JSON columns as text: they are user data, and
-- the caller decides how to read them (Python may not read what another language stored).
SELECT id, queue, task, state::text AS state, attempts, max_attempts, priority, payload::text AS payload_json,
       result::text AS result_json, error::text AS error_json, progress::text AS progress_json,
       checkpoint::text AS checkpoint_json, dedupe_key, key, run_id, run_partition, continued_from,
       lease_owner, created_at, run_after, started_at, finished_at, updated_at
FROM queueworker.tasks WHERE id = %(id)s;

-- name: task_events
-- A task's audit trail, oldest first: all of it (%(limit)s NULL) for `queueworker show`, its first
-- %(limit)s events for the console, whose page stays bounded however often a task was retried. `by_user`:
-- the login that caused it (migration 016; NULL for rows written before).
SELECT at, from_state::text AS from_state, to_state::text AS to_state, worker, lease_token, detail::text AS detail_json,
       by_user
FROM queueworker.task_events WHERE task_id = %(id)s ORDER BY id LIMIT %(limit)s;

-- name: list_tasks
-- `queueworker list`: the newest tasks, by queue and state.
SELECT id, queue, task, state::text AS state, attempts, max_attempts, progress::text AS progress_json,
       created_at, updated_at, key
FROM queueworker.tasks
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(state)s::text IS NULL OR state = %(state)s::queueworker.task_state)
ORDER BY id DESC LIMIT %(limit)s;

-- name: stuck_tasks
-- `status --stuck`: running tasks whose lease has expired and that no rescuer has taken back yet
-- (no live worker rescues, or the task is locked).
SELECT id, queue, task, lease_owner, extract(epoch FROM now() - leased_until)::float8 AS expired_for
FROM queueworker.tasks
WHERE state = 'running' AND leased_until < now() AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY leased_until LIMIT 1000;

-- name: status_counts
-- Counts per queue and state. Terminal states are counted too, which reads history: this is
-- for humans (`queueworker status`), not for the controller's tick.
SELECT queue, state::text AS state, count(*) AS n
FROM queueworker.tasks
WHERE %(queue)s::text IS NULL OR queue = %(queue)s
GROUP BY queue, state
ORDER BY queue, state;

-- name: oldest_pending_age
-- How long the oldest ready task of each queue has waited.
SELECT queue, extract(epoch FROM now() - min(run_after))::float8 AS age
FROM queueworker.tasks
WHERE state = 'pending' AND NOT delayed AND (%(queue)s::text IS NULL OR queue = %(queue)s)
GROUP BY queue;

-- name: live_workers
-- `running` is counted from the leases held now (the partial index of running tasks), not the
-- count the worker wrote at its last heartbeat, so it agrees with the queue counts beside it.
SELECT w.id::text AS id, w.hostname, w.pod_name, w.pod_namespace, w.pid, w.queues, w.concurrency,
       (SELECT count(*) FROM queueworker.tasks_active t
        WHERE t.state = 'running' AND t.lease_owner = w.id)::int AS running,
       w.draining, extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age_seconds, w.started_at
FROM queueworker.workers w
WHERE %(queue)s::text IS NULL OR %(queue)s = ANY(w.queues)
ORDER BY w.started_at;

-- name: task_state_counts
-- The given tasks by state (the demo's burst, in a database that may hold other tasks too).
SELECT state::text AS state, count(*)::int AS n
FROM queueworker.tasks WHERE id = ANY(%(ids)s::bigint[])
GROUP BY state;

-- name: worker_loads
-- Leased tasks per live worker process of one host: how busy each is, for the demo to pick the one
-- to scale in.
SELECT w.pid, count(t.id)::int AS leased
FROM queueworker.workers w
LEFT JOIN queueworker.tasks t ON t.lease_owner = w.id AND t.state = 'running'
WHERE w.hostname = %(hostname)s AND w.pid = ANY(%(pids)s::int[])
GROUP BY w.pid;
