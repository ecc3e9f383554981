-- What operators do to tasks that exist: retry and cancel (queueworker.client.operations).
-- Each statement is declared, with its parameter and row types, in queueworker/db/tasks.py.

-- name: retry_task
-- A failed or cancelled task, pending and due now again, with at least one more attempt. No row: the
-- task is unfinished or unknown (task_states tells which). Its queue is woken by notify.notify_queue.
UPDATE queueworker.tasks
SET state = 'pending', delayed = false, run_after = now(), updated_at = now(), finished_at = NULL,
    max_attempts = greatest(max_attempts, attempts + 1)
WHERE id = %(id)s AND state IN ('failed', 'cancelled')
RETURNING id, queue, attempts, max_attempts;

-- name: cancel_tasks
-- `queueworker.cancel` / `cancel_many` / `queueworker cancel`: the tasks given by id, or every task of a
-- queue (%(ids)s NULL), in the given states. The error says who asked (the login) and why, so the audit
-- row does too. The worker holding a running one hears of it at once (channel queueworker_cancel:
-- "worker id lease token"), finds the task cancelled (lease.cancelled_leases: a notification is only a
-- hint, any login may send one), stops the handler and frees the slot; its heartbeat finds out too,
-- should the notification be lost. The lease token stays on the row for that look.
WITH target AS (
    SELECT id, state, lease_owner, lease_token FROM queueworker.tasks
    WHERE (id = ANY(%(ids)s::bigint[]) OR (%(ids)s::bigint[] IS NULL AND queue = %(queue)s))
      AND state = ANY(%(states)s::queueworker.task_state[])
    ORDER BY id
    FOR UPDATE
), cancelled AS (
    UPDATE queueworker.tasks t
    SET state = 'cancelled', updated_at = now(), finished_at = now(),
        lease_owner = NULL, leased_until = NULL, deadline_at = NULL,
        error = jsonb_build_object('type', 'Cancelled', 'retryable', false,
                                   'message', %(reason)s || ' (by ' || session_user || ')')
    FROM target
    WHERE t.id = target.id AND t.state = target.state
    RETURNING t.id, target.state::text AS was, target.lease_owner, target.lease_token
), notified AS (
    SELECT pg_notify('queueworker_cancel', lease_owner::text || ' ' || id || ' ' || lease_token)
    FROM cancelled WHERE was = 'running' AND lease_owner IS NOT NULL
)
SELECT id, was, (SELECT count(*) FROM notified) AS notified FROM cancelled ORDER BY id;

-- name: dedupe_holder
-- The unfinished task, other than this one, that holds this task's dedupe key: what keeps a finished
-- task from being retried.
SELECT h.id, h.state::text AS state, t.queue, t.dedupe_key
FROM queueworker.tasks t
JOIN queueworker.tasks_active h ON h.queue = t.queue AND h.dedupe_key = t.dedupe_key AND h.id <> t.id
WHERE t.id = %(id)s;

-- name: task_states
-- Why a retry or a cancel changed nothing: the tasks' states now (an id without a row: no such task).
SELECT id, state::text AS state FROM queueworker.tasks WHERE id = ANY(%(ids)s::bigint[]);
