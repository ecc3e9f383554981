-- Notifications that are not part of another statement (a listener's self-check, a queue's wake-up) and the
-- LISTENs on fixed channels. Each statement is declared, with its types, in queueworker.db.notify (with the channels).

-- name: notify_check
-- A listener's check that notifications reach it at all (queueworker.runtime.listener), on a
-- channel of its own: through a PgBouncer in transaction pooling mode none ever do.
SELECT pg_notify(%(channel)s, '');

-- name: notify_queue
-- Wakes a queue's workers (channel queueworker) where tasks became claimable by a statement that
-- does not notify by itself: `queueworker.retry`, in the transaction that retries the task (like
-- every notification, delivered when it commits).
SELECT pg_notify('queueworker', %(queue)s);

-- name: listen_announcements
-- Producers (and the workers' scheduler) announce tasks on the channel `queueworker`, one
-- notification per queue per statement (queueworker.events.parse_announcement reads them): a
-- QueueWorker idle at zero replicas then ticks at once instead of at its next poll.
LISTEN queueworker;

-- name: listen_finished
-- `wait_for` hears at once of a task enqueued with notify_on_finish (the complete statements of lease.sql
-- notify this channel with the task's id), on a connection in autocommit mode, and looks the task up:
-- any login may notify this channel too.
LISTEN queueworker_finished;

-- name: unlisten_finished
-- When `wait_for` returns: the connection is the caller's, and must not go on collecting notifications.
UNLISTEN queueworker_finished;
