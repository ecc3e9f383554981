-- queueworker schema, version 10: a notification when a task finishes, for those that ask.
--
-- A task enqueued with `notify_on_finish` sends `pg_notify('queueworker_finished', id)` when it
-- ends succeeded, failed or cancelled, so `queueworker.wait_for` wakes at once instead of polling.
-- Only such tasks pay for it: the success statements notify from their own rows, and every other
-- way a task ends (a failure, a rescue, a cancel, a cascade) goes through a statement trigger
-- (`queueworker.notify_finished`, in migrations/functions/20_notifications.sql).

ALTER TABLE queueworker.tasks ADD COLUMN notify_on_finish boolean NOT NULL DEFAULT false;
