-- Notifications that are not part of another statement: a listener's self-check and a queue's wake-up.
-- Each statement is declared, with its parameter type, in queueworker.db.notify (with the channels).

-- name: notify_check
-- A listener's check that notifications reach it at all (queueworker.runtime.listener), on a
-- channel of its own: through a PgBouncer in transaction pooling mode none ever do.
SELECT pg_notify(%(channel)s, '');

-- name: notify_queue
-- Wakes a queue's workers (channel queueworker) where tasks became claimable by a statement that
-- does not notify by itself: `queueworker.retry`, in the transaction that retries the task (like
-- every notification, delivered when it commits).
SELECT pg_notify('queueworker', %(queue)s);
