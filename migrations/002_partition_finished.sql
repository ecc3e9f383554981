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
DROP TRIGGER tasks_audit_insert ON queueworker.tasks_v1;
DROP TRIGGER tasks_audit_update ON queueworker.tasks_v1;
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

-- What an audit row says about a transition beyond its states (one definition for the update
-- trigger and for sql.COMPLETE_SUCCEEDED).
CREATE FUNCTION queueworker.transition_detail(attempts integer, new_error jsonb, old_error jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'attempts', attempts,
        'error', CASE WHEN new_error IS DISTINCT FROM old_error THEN new_error -> 'message' END,
        'error_type', CASE WHEN new_error IS DISTINCT FROM old_error THEN new_error -> 'type' END))
$$;

CREATE OR REPLACE FUNCTION queueworker.audit_task_updates() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT n.id, o.state, n.state, coalesce(o.lease_owner, n.lease_owner), n.lease_token,
           queueworker.transition_detail(n.attempts, n.error, o.error)
    FROM new_rows n
    JOIN old_rows o ON o.id = n.id
    WHERE n.state IS DISTINCT FROM o.state;
    RETURN NULL;
END
$$;

-- Statement-level triggers on the partitioned table see rows of both partitions, and a row
-- that moves partitions in an UPDATE appears in that UPDATE's transition tables.
CREATE TRIGGER tasks_audit_insert AFTER INSERT ON queueworker.tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.audit_task_inserts();

CREATE TRIGGER tasks_audit_update AFTER UPDATE ON queueworker.tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.audit_task_updates();

-- The hot path moves rows itself: a successful completion deletes them from `tasks_active`,
-- inserts them into `tasks_finished` and writes their audit rows in one statement
-- (sql.COMPLETE_SUCCEEDED), which costs what an in-place UPDATE did, where an UPDATE routed
-- through the parent costs Postgres 15 about twice as much per row. DML aimed at a partition
-- does not fire the parent's statement triggers, so that statement audits itself (the state
-- machine tests check that every transition the SQL makes leaves its audit row).

ANALYZE queueworker.tasks;
