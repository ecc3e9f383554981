-- queueworker schema, version 1.
-- Everything lives in the `queueworker` schema so it never collides with application tables.
-- Applied by `queueworker migrate` inside one transaction, under an advisory lock.

CREATE TYPE queueworker.task_state AS ENUM (
    'pending',    -- claimable once run_after has passed
    'running',    -- leased by one worker (lease_owner, lease_token, leased_until)
    'retrying',   -- waiting out a backoff after a retryable failure; promoted to pending when due
    'succeeded',  -- terminal
    'failed',     -- terminal: permanent error, attempts exhausted, or unknown task
    'cancelled'   -- terminal: cancelled by an operator
);

CREATE TABLE queueworker.tasks (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue           text NOT NULL DEFAULT 'default'
                    CHECK (queue ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
    task            text NOT NULL CHECK (length(task) BETWEEN 1 AND 200),
    state           queueworker.task_state NOT NULL DEFAULT 'pending',
    -- A pending task due later stays out of the claim index until the scheduler admits it when
    -- due. The producer admits tasks due at once; rows inserted any other way wait for the
    -- scheduler, which is always correct, only slower.
    delayed         boolean NOT NULL DEFAULT true,
    priority        integer NOT NULL DEFAULT 0,          -- higher runs first
    run_after       timestamptz NOT NULL DEFAULT now(),
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts    integer NOT NULL DEFAULT 10 CHECK (max_attempts >= 1),
    rescues         integer NOT NULL DEFAULT 0,          -- leases recovered after expiry
    timeout_seconds integer CHECK (timeout_seconds > 0), -- hard per-attempt deadline; NULL = worker default
    payload         jsonb NOT NULL DEFAULT '{}'::jsonb,
    result          jsonb,
    error           jsonb,                               -- {type, message, traceback, retryable}
    lease_owner     uuid,                                -- workers.id of the holder while running
    lease_token     bigint NOT NULL DEFAULT 0,           -- fencing token, incremented on every claim
    leased_until    timestamptz,                         -- never indexed: heartbeats stay HOT updates
    deadline_at     timestamptz,                         -- hard deadline of the current attempt
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    CONSTRAINT running_has_lease CHECK (
        state <> 'running' OR (lease_owner IS NOT NULL AND leased_until IS NOT NULL AND deadline_at IS NOT NULL))
) WITH (
    fillfactor = 80,                          -- room for HOT heartbeat updates
    autovacuum_vacuum_scale_factor = 0.01,    -- vacuum a hot queue table early and often
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

-- The claim index holds only claimable pending rows, in claim order: neither finished history
-- nor tasks scheduled for later ever sit in it.
CREATE INDEX tasks_claim ON queueworker.tasks (queue, priority DESC, run_after, id)
    WHERE state = 'pending' AND NOT delayed;
-- Rows waiting for a time (backing off, or scheduled for later), in due order, for the scheduler.
CREATE INDEX tasks_waiting ON queueworker.tasks (run_after)
    WHERE state = 'retrying' OR (state = 'pending' AND delayed);
-- Leased rows, for the rescuer, depth queries and per-worker lease counts.
CREATE INDEX tasks_running ON queueworker.tasks (queue, lease_owner) WHERE state = 'running';
-- Finished rows by age, for retention clean-up.
CREATE INDEX tasks_finished ON queueworker.tasks (finished_at) WHERE finished_at IS NOT NULL;

-- Immutable audit trail: one row per state transition, written by triggers on tasks,
-- so completeness never depends on a code path remembering to write it. The triggers and their
-- functions are defined in migrations/functions/10_audit.sql (applied after the versioned
-- migrations), as every function and trigger of the schema is.
CREATE TABLE queueworker.task_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id     bigint NOT NULL,
    from_state  queueworker.task_state,          -- NULL for the insert
    to_state    queueworker.task_state NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    worker      uuid,
    lease_token bigint NOT NULL,
    detail      jsonb
) WITH (autovacuum_vacuum_insert_scale_factor = 0.05);

CREATE INDEX task_events_task ON queueworker.task_events (task_id, id);

-- One row per live worker process; the controller reads it to choose which pods to scale in.
CREATE TABLE queueworker.workers (
    id            uuid PRIMARY KEY,                 -- random per process start, never the pod name
    hostname      text NOT NULL,
    pod_name      text,
    pod_namespace text,
    pid           integer NOT NULL,
    queues        text[] NOT NULL,
    concurrency   integer NOT NULL,
    running       integer NOT NULL DEFAULT 0,
    draining      boolean NOT NULL DEFAULT false,
    version       text NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50);
