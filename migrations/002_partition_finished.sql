-- queueworker schema, version 2: finished tasks move to their own partition.
--
-- `queueworker.tasks` becomes a table partitioned by state: `tasks_active` (pending, running,
-- retrying) and `tasks_finished` (succeeded, failed, cancelled). Reading `queueworker.tasks`
-- still sees every task; a transition into or out of a terminal state moves the row.
-- Why: with one table, every vacuum of the hot rows also scanned the indexes over all of the
-- history (10M finished rows: ~450 MB of btree per pass), which cost a busy queue ~20-30% of
-- its throughput. Now the active partition stays as small as the live work, and the finished
-- partition is insert-mostly (its vacuums have no dead rows to clean until the cleaner runs).
--
-- The copy rewrites the table under an ACCESS EXCLUSIVE lock: on a big history, run
-- `queueworker migrate` in a quiet moment (or lower the retention first).

ALTER TABLE queueworker.tasks RENAME TO tasks_v1;
ALTER TABLE queueworker.tasks_v1 DROP CONSTRAINT tasks_pkey;
DROP INDEX queueworker.tasks_claim, queueworker.tasks_waiting, queueworker.tasks_running,
           queueworker.tasks_finished;
-- A database migrated before the functions moved to migrations/functions/ has the audit triggers
-- of version 1 on the old table; one migrated since has none yet.
DROP TRIGGER IF EXISTS tasks_audit_insert ON queueworker.tasks_v1;
DROP TRIGGER IF EXISTS tasks_audit_update ON queueworker.tasks_v1;
ALTER SEQUENCE queueworker.tasks_id_seq RENAME TO tasks_v1_id_seq;

-- Same columns, in the same order, as version 1.
CREATE TABLE queueworker.tasks (
    id              bigint GENERATED ALWAYS AS IDENTITY,
    queue           text NOT NULL DEFAULT 'default'
                    CHECK (queue ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
    task            text NOT NULL CHECK (length(task) BETWEEN 1 AND 200),
    state           queueworker.task_state NOT NULL DEFAULT 'pending',
    delayed         boolean NOT NULL DEFAULT true,
    priority        integer NOT NULL DEFAULT 0,
    run_after       timestamptz NOT NULL DEFAULT now(),
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts    integer NOT NULL DEFAULT 10 CHECK (max_attempts >= 1),
    rescues         integer NOT NULL DEFAULT 0,
    timeout_seconds integer CHECK (timeout_seconds > 0),
    payload         jsonb NOT NULL DEFAULT '{}'::jsonb,
    result          jsonb,
    error           jsonb,
    lease_owner     uuid,
    lease_token     bigint NOT NULL DEFAULT 0,
    leased_until    timestamptz,
    deadline_at     timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    CONSTRAINT running_has_lease CHECK (
        state <> 'running' OR (lease_owner IS NOT NULL AND leased_until IS NOT NULL AND deadline_at IS NOT NULL)),
    -- A partitioned table's key must hold the partition key. `id` alone stays unique because
    -- only the identity column hands ids out (and a moved row keeps its id).
    PRIMARY KEY (id, state)
) PARTITION BY LIST (state);

CREATE TABLE queueworker.tasks_active PARTITION OF queueworker.tasks
    FOR VALUES IN ('pending', 'running', 'retrying')
    WITH (
        fillfactor = 80,                          -- room for HOT heartbeat updates
        autovacuum_vacuum_scale_factor = 0.01,    -- vacuum a hot queue table early and often
        autovacuum_vacuum_insert_scale_factor = 0.02,
        autovacuum_analyze_scale_factor = 0.02,
        autovacuum_vacuum_cost_delay = 1
    );

CREATE TABLE queueworker.tasks_finished PARTITION OF queueworker.tasks
    FOR VALUES IN ('succeeded', 'failed', 'cancelled')
    WITH (autovacuum_vacuum_cost_delay = 1);      -- the cleaner's deletes are its only dead rows

INSERT INTO queueworker.tasks OVERRIDING SYSTEM VALUE SELECT * FROM queueworker.tasks_v1;
SELECT setval(pg_get_serial_sequence('queueworker.tasks', 'id'), last_value, is_called)
FROM queueworker.tasks_v1_id_seq;
DROP TABLE queueworker.tasks_v1;

-- The claim index holds only claimable pending rows, in claim order: neither finished history
-- nor tasks scheduled for later ever sit in it.
CREATE INDEX tasks_claim ON queueworker.tasks_active (queue, priority DESC, run_after, id)
    WHERE state = 'pending' AND NOT delayed;
-- Rows waiting for a time (backing off, or scheduled for later), in due order, for the scheduler.
CREATE INDEX tasks_waiting ON queueworker.tasks_active (run_after)
    WHERE state = 'retrying' OR (state = 'pending' AND delayed);
-- Leased rows, for the rescuer, depth queries and per-worker lease counts.
CREATE INDEX tasks_running ON queueworker.tasks_active (queue, lease_owner) WHERE state = 'running';
-- Finished rows by age, for retention clean-up.
CREATE INDEX tasks_finished_at ON queueworker.tasks_finished (finished_at);

-- The audit triggers go on the partitioned table: statement-level triggers there see rows of both
-- partitions, and a row that moves partitions in an UPDATE appears in that UPDATE's transition
-- tables. The hot path (sql.COMPLETE_SUCCEEDED) moves rows between the partitions itself and audits
-- them itself. Both, and `queueworker.transition_detail`, are in migrations/functions/10_audit.sql.

ANALYZE queueworker.tasks;
