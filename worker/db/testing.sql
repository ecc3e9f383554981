-- queueworker.testing: what an application's own tests ask of the queue (assert_enqueued,
-- refute_enqueued, drain). Each statement is declared, with its parameter and row types, in
-- queueworker/db/testing.py.

-- name: enqueued
-- The tasks waiting to run (pending, retrying or blocked) that match every filter given (NULL: any),
-- oldest first. The payload matches by containment (JSON `@>`: it has the fields given, with those
-- values, and maybe others), as a test usually names the fields it cares about.
SELECT id, queue, task, state::text AS state, payload::text AS payload_json, priority, key, run_after
FROM queueworker.tasks_active
WHERE state IN ('pending', 'retrying', 'blocked')
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(key)s::text IS NULL OR key = %(key)s::text)
  AND (%(priority)s::integer IS NULL OR priority = %(priority)s::integer)
  AND (%(payload)s::jsonb IS NULL OR payload @> %(payload)s::jsonb)
ORDER BY id
LIMIT %(limit)s;

-- name: due_queues
-- The queues that have a task due now, for a drain of every queue.
SELECT DISTINCT queue FROM queueworker.tasks_active
WHERE state IN ('pending', 'retrying') AND run_after <= now()
ORDER BY queue;

-- name: drain_left
-- What keeps a drain going in its queues: tasks due now (pending, or retrying, whose time has come)
-- and tasks its worker holds. A retry backing off into the future is not due, nor a blocked task.
SELECT count(*) FILTER (WHERE state IN ('pending', 'retrying') AND run_after <= now())::int AS due,
       count(*) FILTER (WHERE state = 'running' AND lease_owner = %(worker)s)::int AS running
FROM queueworker.tasks_active
WHERE queue = ANY(%(queues)s::text[]);

-- name: drained
-- Every task a worker claimed (its audit rows name it), as stored now, in id order.
SELECT id, queue, task, state::text AS state, attempts, max_attempts, priority, payload::text AS payload_json,
       result::text AS result_json, error::text AS error_json, progress::text AS progress_json,
       checkpoint::text AS checkpoint_json, dedupe_key, key, run_id, run_partition, continued_from,
       lease_owner, created_at, run_after, started_at, finished_at, updated_at
FROM queueworker.tasks
WHERE id IN (SELECT e.task_id FROM queueworker.task_events e WHERE e.worker = %(worker)s AND e.to_state = 'running')
ORDER BY id;
