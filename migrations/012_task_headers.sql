-- queueworker schema, version 12: headers a task carries from its producer to its attempts.
--
-- `headers` is a small JSON object of string values (TaskSpec.headers, checked by the producer):
-- the W3C trace context (`traceparent`, `tracestate`) when the producer enqueued under an
-- OpenTelemetry span, and whatever the caller passed. NULL for a task enqueued without any. The
-- column lives on the parent, so both partitions have it; UPDATEs through the parent move it with
-- the row, and sql.COMPLETE_SUCCEEDED, which moves rows between the partitions itself, lists it.
-- enqueue_tasks takes each spec's headers (sql.ENQUEUE_TASKS); the version without them stays, for
-- producers of earlier versions during a rolling upgrade, and inserts none. Both are in
-- migrations/functions/60_enqueue.sql.

ALTER TABLE queueworker.tasks ADD COLUMN headers jsonb;
