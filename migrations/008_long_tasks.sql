-- queueworker schema, version 8: long tasks.
--
-- `progress` is what a handler last reported (`ctx.progress`: done, total, message, at), written
-- with the heartbeat and kept when the task finishes. `checkpoint` is the JSON a handler saved
-- (`ctx.save_checkpoint`, a write fenced by the lease), given to the task's next attempt after a
-- drain, a rescue or a retry, and dropped when the task succeeds. `continued_from` links a page
-- a handler enqueued by returning `Continue(payload)` to the task that continued.

ALTER TABLE queueworker.tasks ADD COLUMN progress jsonb, ADD COLUMN checkpoint jsonb, ADD COLUMN continued_from bigint;
