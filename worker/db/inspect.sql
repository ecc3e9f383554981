-- Reading tasks and workers back: `get_task`, `queueworker show`, `list` and `status`.
-- Each statement is declared, with its parameter and row types, in queueworker/db/inspect.py.

-- name: task
-- One task, for `get_task` and `queueworker show`. JSON columns as text: they are user data, and
-- the caller decides how to read them (Python may not read what another language stored).
SELECT id, queue, task, state::text AS state, attempts, max_attempts, priority, payload::text AS payload_json,
       result::text AS result_json, error::text AS error_json, progress::text AS progress_json,
       checkpoint::text AS checkpoint_json, dedupe_key, run_id, run_partition, continued_from,
       lease_owner, created_at, run_after, started_at, finished_at, updated_at
FROM queueworker.tasks WHERE id = %(id)s;

-- name: task_events
-- A task's audit trail, oldest first.
SELECT at, from_state::text AS from_state, to_state::text AS to_state, worker, lease_token, detail::text AS detail_json
FROM queueworker.task_events WHERE task_id = %(id)s ORDER BY id;

-- name: list_tasks
-- `queueworker list`: the newest tasks, by queue and state.
SELECT id, queue, task, state::text AS state, attempts, max_attempts, progress::text AS progress_json,
       created_at, updated_at
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
