-- Notifications that are not part of another statement: the listener's self-check and a queue's wake-up.
-- Each statement is declared, with its parameter and row types, in queueworker/db/notify.py.

-- name: notify_check
-- A listener's check that notifications reach it at all (worker/runtime/listener.py): to its own channel.
SELECT pg_notify(%(channel)s, '');

-- name: notify_queue
SELECT pg_notify('queueworker', %(queue)s);
