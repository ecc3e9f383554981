-- queueworker functions: the audit trail of tasks (`queueworker.task_events`).
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE: CREATE OR REPLACE TRIGGER cannot
-- replace a constraint trigger). A SQL-language body is checked when it is created: what it calls
-- must come from an earlier file, or from earlier in the same one. PL/pgSQL bodies are resolved
-- when they run.

-- One row per state transition, written by triggers on tasks, so completeness never depends on a
-- code path remembering to write it. The triggers run as the schema owner (SECURITY DEFINER): an
-- enqueue or an operator's cancel still writes its audit row, while the role doing it holds no
-- privilege on `task_events`. A definer function must not resolve names through the caller's
-- search_path, hence `SET search_path = pg_catalog, pg_temp` and schema-qualified names throughout.

-- What an audit row says about a transition beyond its states (one definition for the update
-- trigger and for `complete_succeeded` in worker/db/lease.sql). STABLE, as jsonb_build_object is:
-- declared IMMUTABLE, Postgres would not inline it (an immutable function's body must be immutable
-- too), and ran it as a statement of its own for every task completed, 2-3 µs each. Inlined, its
-- body is parsed in the caller's statement: every name in it is qualified.
CREATE OR REPLACE FUNCTION queueworker.transition_detail(attempts integer, new_error jsonb, old_error jsonb)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
        'attempts', attempts,
        'error', CASE WHEN new_error IS DISTINCT FROM old_error THEN new_error OPERATOR(pg_catalog.->) 'message' END,
        'error_type', CASE WHEN new_error IS DISTINCT FROM old_error THEN new_error OPERATOR(pg_catalog.->) 'type' END))
$$;

-- The columns whose in-place change on a pending task is a replacement (audited).
CREATE OR REPLACE FUNCTION queueworker.replaced_columns(new_row queueworker.tasks, old_row queueworker.tasks)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT pg_catalog.jsonb_agg(name ORDER BY name) FROM (VALUES
        ('payload', new_row.payload IS DISTINCT FROM old_row.payload),
        ('priority', new_row.priority IS DISTINCT FROM old_row.priority),
        ('run_after', new_row.run_after IS DISTINCT FROM old_row.run_after)) AS c(name, changed)
    WHERE changed
$$;

-- Statement-level triggers with transition tables: one INSERT ... SELECT per statement,
-- so a batched claim or completion of 500 rows costs one audit insert, not 500.
-- The insert trigger also holds a producer to its queues (queue grants, 15_queue_grants.sql): a
-- plain insert into a queue the acting login may not use fails whole, in one line. A login free of
-- grants pays one look at queueworker.queue_grants per statement.
CREATE OR REPLACE FUNCTION queueworker.audit_task_inserts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT queueworker.unbound_by_grants() THEN
        PERFORM queueworker.require_queues(ARRAY(SELECT DISTINCT n.queue FROM new_rows n));
    END IF;
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT n.id, NULL, n.state, n.lease_owner, n.lease_token, NULL
    FROM new_rows n;
    RETURN NULL;
END
$$;

-- A pending task's payload, priority or schedule changed in place (a producer's
-- `on_conflict="replace"`, or an operator's UPDATE) leaves an audit row too: `pending -> pending`
-- with `{"replaced": [...the columns...]}`.
-- Parent-routed transitions (a failure, a rescue, a cancel, a retry, and settlements themselves)
-- settle what depends on the tasks they ended or revived (40_dependencies.sql), and count for the
-- runs these belong to (50_runs.sql).
-- The old and new rows are paired by joins of the two transition tables, planned without nested
-- loops (hash joins: linear in the rows, however few the planner expected): these statements take
-- no parameter, so a session plans them once, for the transition tables of the first update it
-- makes (often of one row), and a nested loop planned for one row compared every row with every
-- other in a later update of 5,000 (25 million comparisons, about 2 s, per join: a scheduler pass
-- admitting 5,000 due tasks took 5 s, 7 s in a keyed queue; bench/admission.py). For this
-- transaction only, and put back before the functions called with the rows run (notify_finished
-- and fair_tag_updates do the same).
CREATE OR REPLACE FUNCTION queueworker.audit_task_updates() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    nestloop text := current_setting('enable_nestloop');
    moved bigint[];
    ids bigint[];
    run_ids bigint[];
    partitions integer[];
    old_states text[];
    new_states text[];
BEGIN
    PERFORM set_config('enable_nestloop', 'off', true);
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT n.id, o.state, n.state, coalesce(o.lease_owner, n.lease_owner), n.lease_token,
           CASE WHEN n.state IS DISTINCT FROM o.state
                THEN queueworker.transition_detail(n.attempts, n.error, o.error)
                ELSE jsonb_build_object('replaced', queueworker.replaced_columns(n, o)) END
    FROM new_rows n
    JOIN old_rows o ON o.id = n.id
    WHERE n.state IS DISTINCT FROM o.state
       OR (n.state = 'pending' AND queueworker.replaced_columns(n, o) IS NOT NULL);
    SELECT array_agg(n.id), array_agg(n.run_id), array_agg(n.run_partition), array_agg(o.state::text),
           array_agg(n.state::text)
    INTO ids, run_ids, partitions, old_states, new_states
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.run_id IS NOT NULL AND n.state IS DISTINCT FROM o.state;
    IF coalesce(current_setting('queueworker.settling', true), '') <> 'on' THEN
        SELECT array_agg(n.id) INTO moved
        FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE n.state IS DISTINCT FROM o.state
          AND (n.state IN ('succeeded', 'failed', 'cancelled') OR o.state IN ('failed', 'cancelled'));
    END IF;
    PERFORM set_config('enable_nestloop', nestloop, true);
    IF ids IS NOT NULL THEN
        PERFORM queueworker.count_run_outcomes(ids, run_ids, partitions, old_states, new_states);
    END IF;
    IF moved IS NOT NULL THEN
        PERFORM queueworker.settle_dependents(moved);
    END IF;
    RETURN NULL;
END
$$;

-- Append-only audit logs (task_events here, run_events and queue_events in 50_runs.sql and
-- 70_flow_control.sql): refused UPDATE and TRUNCATE even to the owner (who can still disable
-- triggers; no trigger binds the owner).
CREATE OR REPLACE FUNCTION queueworker.forbid_event_updates() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'queueworker.% is an append-only audit log', TG_TABLE_NAME;
END
$$;

-- Statement-level triggers on the partitioned table see rows of both partitions, and a row
-- that moves partitions in an UPDATE appears in that UPDATE's transition tables.
DROP TRIGGER IF EXISTS tasks_audit_insert ON queueworker.tasks;
CREATE TRIGGER tasks_audit_insert AFTER INSERT ON queueworker.tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.audit_task_inserts();

DROP TRIGGER IF EXISTS tasks_audit_update ON queueworker.tasks;
CREATE TRIGGER tasks_audit_update AFTER UPDATE ON queueworker.tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.audit_task_updates();

-- DML aimed at a partition does not fire the parent's statement triggers. The hot path moves rows
-- itself: a successful completion deletes them from `tasks_active`, inserts them into
-- `tasks_finished` and writes their audit rows in one statement (`complete_succeeded` in
-- worker/db/lease.sql), which
-- costs what an in-place UPDATE did, where an UPDATE routed through the parent costs Postgres 15
-- about twice as much per row; that statement audits itself (the state machine tests check that
-- every transition the SQL makes leaves its audit row). Inserts aimed at `tasks_active` (the
-- producer's enqueue_tasks, 60_enqueue.sql, which needs the partition's unique index for its
-- ON CONFLICT) are audited by a trigger of their own. A table with a transition-table trigger cannot
-- be attached as a partition, so migration 006 drops this one before it re-attaches `tasks_active`.
DROP TRIGGER IF EXISTS tasks_active_audit_insert ON queueworker.tasks_active;
CREATE TRIGGER tasks_active_audit_insert AFTER INSERT ON queueworker.tasks_active
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.audit_task_inserts();

DROP TRIGGER IF EXISTS task_events_append_only ON queueworker.task_events;
CREATE TRIGGER task_events_append_only BEFORE UPDATE ON queueworker.task_events
    FOR EACH ROW EXECUTE FUNCTION queueworker.forbid_event_updates();

DROP TRIGGER IF EXISTS task_events_no_truncate ON queueworker.task_events;
CREATE TRIGGER task_events_no_truncate BEFORE TRUNCATE ON queueworker.task_events
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.forbid_event_updates();
