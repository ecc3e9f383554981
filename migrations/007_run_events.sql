-- queueworker schema, version 7: the audit trail of partitioned runs, `queueworker.run_events`.
--
-- A task's transitions are in `task_events`; a run's are here, one row per transition, written by
-- a trigger on `queueworker.runs` so no statement that moves a run can forget it: started, the
-- consolidation enqueued (running -> running), succeeded, failed (with the alert, if any, in the
-- same row), running again after a retry or a forced finalisation. Counter changes that move
-- nothing are not transitions: the task events of the partitions record those. `by_user` is the
-- login that caused it (`session_user`: a person's `run finalize --force`, a worker's completion).
-- The trigger, its function `queueworker.audit_run` and the append-only guards of `run_events` are
-- in migrations/functions/50_runs.sql (as is advance_run, changed in this version so that a run
-- fails and gets its alert in one update: one transition, one event).

CREATE TABLE queueworker.run_events (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id     bigint NOT NULL,
    from_state queueworker.run_state,          -- NULL: the run was started
    to_state   queueworker.run_state NOT NULL,
    detail     jsonb NOT NULL,                 -- the counters, the consolidation and alert, forced
    by_user    text NOT NULL DEFAULT session_user,
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX run_events_run ON queueworker.run_events (run_id, id);
CREATE INDEX run_events_at ON queueworker.run_events (at);             -- the dashboard's time ranges
CREATE INDEX runs_running ON queueworker.runs (id) WHERE state = 'running';
CREATE INDEX runs_started ON queueworker.runs (started_at);
