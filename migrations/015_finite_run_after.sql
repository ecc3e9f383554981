-- A task is due at a time every reader can handle: never -infinity or infinity, nor outside the years
-- 1 to 9999 that Python's datetime (the worker, the CLI, the controller) can hold. Such a value, written
-- through SQL, broke `queueworker status`, the controller's depth read for every queue read with it
-- (a queue at zero then never scaled up) and the promotion of due tasks for everyone.
--
-- Rows already holding one keep their meaning, as near as a readable time allows: one due at once
-- (before the year 2) becomes due at its creation, one due never (after 9999) waits until the last day
-- Python can read. Nothing is deleted; each change is audited as any update of a task is.
UPDATE queueworker.tasks SET run_after = created_at WHERE run_after < '0002-01-01';
UPDATE queueworker.tasks SET run_after = '9999-12-30' WHERE run_after > '9999-12-30';

ALTER TABLE queueworker.tasks
    ADD CONSTRAINT run_after_readable CHECK (run_after >= '0002-01-01' AND run_after <= '9999-12-30');
