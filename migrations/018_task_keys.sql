-- queueworker schema, version 18: a task's key.
--
-- A key (TaskSpec.key, `queueworker enqueue --key`) names what a task belongs to within its queue:
-- a tenant, a customer, a source. Fair share across keys and per-key limits build on it
-- (docs/flow-control.md); for now it is stored, copied to a continued task's next page and shown.
-- NULL for a task without one, which behaves exactly as before. Printable text of 1 to 256
-- characters, checked by the producer (queueworker.names.TaskKey) and, for writers that bypass it,
-- by the CHECK below: no control character (C0, DEL, C1) and no line or paragraph separator, so a
-- key can be shown on one line of a terminal. Postgres's text holds no NUL.
--
-- The column lives on the parent, so both partitions have it; UPDATEs through the parent move it
-- with the row, and COMPLETE_SUCCEEDED and COMPLETE_CONTINUED (worker/db/lease.sql), which move
-- rows between the partitions themselves, list it. Workers of earlier versions list the columns
-- they knew: a keyed task they finish keeps no key in tasks_finished, and its next page (Continue)
-- none either, so upgrade the workers before producers set keys. The CHECK is NOT VALID: every existing row holds
-- NULL, which it allows, so there is nothing to scan while the table is locked; it holds for every
-- row written from now on.
ALTER TABLE queueworker.tasks ADD COLUMN key text;
ALTER TABLE queueworker.tasks
    ADD CONSTRAINT tasks_key_text
    CHECK (key IS NULL OR (length(key) BETWEEN 1 AND 256 AND key !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]')) NOT VALID;

-- A schedule's slots carry its key (`queueworker cron add --key`, `periodic(..., key=...)`).
ALTER TABLE queueworker.cron_jobs
    ADD COLUMN key text
    CONSTRAINT cron_jobs_key_text
    CHECK (key IS NULL OR (length(key) BETWEEN 1 AND 256 AND key !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]'));
