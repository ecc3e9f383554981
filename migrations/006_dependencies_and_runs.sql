-- queueworker schema, version 6: dependencies between tasks (staged pipelines) and partitioned runs.
--
-- A task enqueued with prerequisites starts `blocked`: unclaimable, counted apart. It becomes
-- `pending` when every prerequisite has succeeded, in the statement that records the last success;
-- it is `cancelled` (error type DependencyFailed, naming the prerequisite) when one ends failed or
-- cancelled, unless its edge says to run anyway; retrying that prerequisite re-blocks what its end
-- cancelled. Cancellation and re-blocking carry on down the graph. Workers never advance
-- downstream work and the orchestration never marks work done: the database moves dependents only
-- from `blocked` (or a cancellation it made itself), as prerequisites finish.
--
-- Who settles a dependent, and why it cannot be missed when a prerequisite's end and a new
-- dependent's enqueue happen in two transactions at once: both sides take one advisory lock before
-- they look (migrations/functions/40_dependencies.sql, which defines the settling functions and the
-- deferred constraint trigger, explains it).
--
-- Partitioned runs (seed 003):
--
-- A run fans out `expected` partition tasks and counts their terminal outcomes (fan-in) in the
-- statements that record them: a completion, a failure, a rescue that fails a task, a cancel, a
-- retry that takes an outcome back. The run's row lock serialises concurrent counts, so they are
-- exact however outcomes are batched. When every partition has succeeded, the run's `on_success`
-- task (the consolidation) is enqueued once, by the statement that counted the last success; when
-- a partition ends failed or cancelled, the run fails and its `on_failure` task (the alert) is
-- enqueued once, and no consolidation happens unless the run is finalised with force. The run
-- succeeds, and its watermark advances (to the run's start: everything before it was covered),
-- only when the consolidation succeeds, or, without one, when the last partition does. The functions
-- that count and move runs are in migrations/functions/50_runs.sql; the producer's enqueue_tasks,
-- which replaced enqueue_unique here, in 60_enqueue.sql.

-- Blocked tasks are unfinished work: they live in `tasks_active` (and hold dedupe keys there). A
-- table with a transition-table trigger cannot be attached as a partition: that trigger (the audit
-- of inserts aimed at the partition, since migration 004) goes, and migrations/functions/10_audit.sql
-- creates it again after the versioned migrations. A database migrated since the functions moved
-- there has none yet at this point.
DROP TRIGGER IF EXISTS tasks_active_audit_insert ON queueworker.tasks_active;
ALTER TABLE queueworker.tasks DETACH PARTITION queueworker.tasks_active;
ALTER TABLE queueworker.tasks_active ADD CONSTRAINT tasks_active_states
    CHECK (state IN ('pending', 'running', 'retrying', 'blocked'));  -- lets ATTACH skip its scan
ALTER TABLE queueworker.tasks ATTACH PARTITION queueworker.tasks_active
    FOR VALUES IN ('pending', 'running', 'retrying', 'blocked');
ALTER TABLE queueworker.tasks_active DROP CONSTRAINT tasks_active_states;

-- One row per edge. A dependent is always enqueued after its prerequisites exist, so it has the
-- larger id: the CHECK makes a cycle impossible.
CREATE TABLE queueworker.task_dependencies (
    prerequisite_id   bigint NOT NULL,
    task_id           bigint NOT NULL,
    cancel_on_failure boolean NOT NULL,   -- TaskSpec.on_dependency_failure = "cancel"
    PRIMARY KEY (prerequisite_id, task_id),
    CONSTRAINT prerequisite_first CHECK (prerequisite_id < task_id)
);
CREATE INDEX task_dependencies_task ON queueworker.task_dependencies (task_id);

-- Blocked tasks by queue, for the controller's depth read (sql.QUEUE_DEPTH).
CREATE INDEX tasks_blocked ON queueworker.tasks_active (queue) WHERE state = 'blocked';

CREATE TYPE queueworker.run_state AS ENUM ('running', 'succeeded', 'failed');

CREATE TABLE queueworker.runs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name             text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    state            queueworker.run_state NOT NULL DEFAULT 'running',
    expected         integer NOT NULL CHECK (expected >= 1),
    succeeded        integer NOT NULL DEFAULT 0 CHECK (succeeded >= 0),
    failed           integer NOT NULL DEFAULT 0 CHECK (failed >= 0),
    cancelled        integer NOT NULL DEFAULT 0 CHECK (cancelled >= 0),
    on_success       jsonb,      -- {task, queue, payload, priority, max_attempts, timeout_seconds}
    on_failure       jsonb,
    success_task_id  bigint,     -- the consolidation, once enqueued
    failure_task_id  bigint,     -- the alert, once enqueued
    forced           boolean NOT NULL DEFAULT false,
    watermark        text,       -- the name of the watermark this run advances
    watermark_before jsonb,
    watermark_after  jsonb,
    started_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    CONSTRAINT outcomes_bounded CHECK (succeeded + failed + cancelled <= expected)
);
CREATE INDEX runs_name ON queueworker.runs (name, id DESC);

CREATE TABLE queueworker.watermarks (
    name       text PRIMARY KEY,
    value      jsonb NOT NULL,
    run_id     bigint,
    updated_at timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE queueworker.tasks ADD COLUMN run_id bigint, ADD COLUMN run_partition integer;
CREATE INDEX tasks_run ON queueworker.tasks (run_id, run_partition) WHERE run_id IS NOT NULL;

-- enqueue_tasks (migrations/functions/60_enqueue.sql) took the place of enqueue_unique (version 4).
-- A database migrated since the functions moved to migrations/functions/ never had it.
DROP FUNCTION IF EXISTS queueworker.enqueue_unique(text[], text[], jsonb[], integer[], timestamptz[], integer[],
                                                   integer[], text[], boolean[]);

ANALYZE queueworker.tasks;
