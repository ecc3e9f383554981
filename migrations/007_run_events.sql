-- queueworker schema, version 7: the audit trail of partitioned runs, `queueworker.run_events`.
--
-- A task's transitions are in `task_events`; a run's are here, one row per transition, written by
-- a trigger on `queueworker.runs` so no statement that moves a run can forget it: started, the
-- consolidation enqueued (running -> running), succeeded, failed (with the alert, if any, in the
-- same row), running again after a retry or a forced finalisation. Counter changes that move
-- nothing are not transitions: the task events of the partitions record those. `by_user` is the
-- login that caused it (`session_user`: a person's `run finalize --force`, a worker's completion).

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

-- Append-only, like task_events: refused UPDATE and TRUNCATE even to the owner (who can still
-- disable triggers; no trigger binds the owner).
CREATE OR REPLACE FUNCTION queueworker.forbid_event_updates() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'queueworker.% is an append-only audit log', TG_TABLE_NAME;
END
$$;

CREATE TRIGGER run_events_append_only BEFORE UPDATE ON queueworker.run_events
    FOR EACH ROW EXECUTE FUNCTION queueworker.forbid_event_updates();
CREATE TRIGGER run_events_no_truncate BEFORE TRUNCATE ON queueworker.run_events
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.forbid_event_updates();

CREATE FUNCTION queueworker.audit_run() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO queueworker.run_events (run_id, from_state, to_state, detail)
    VALUES (NEW.id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, NEW.state,
            jsonb_strip_nulls(jsonb_build_object(
                'expected', NEW.expected, 'succeeded', NEW.succeeded, 'failed', NEW.failed,
                'cancelled', NEW.cancelled, 'consolidation', NEW.success_task_id, 'alert', NEW.failure_task_id,
                'forced', NEW.forced)));
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_audit_insert AFTER INSERT ON queueworker.runs
    FOR EACH ROW EXECUTE FUNCTION queueworker.audit_run();
CREATE TRIGGER runs_audit_update AFTER UPDATE ON queueworker.runs
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.success_task_id IS DISTINCT FROM NEW.success_task_id
          OR OLD.failure_task_id IS DISTINCT FROM NEW.failure_task_id)
    EXECUTE FUNCTION queueworker.audit_run();

-- As in version 6, but a run fails and gets its alert in one update: one transition, one event.
CREATE OR REPLACE FUNCTION queueworker.advance_run(run_id bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r queueworker.runs;
BEGIN
    SELECT * INTO r FROM queueworker.runs WHERE id = run_id FOR UPDATE;
    IF r.state = 'failed' AND r.failed + r.cancelled = 0 AND r.success_task_id IS NULL THEN
        UPDATE queueworker.runs SET state = 'running', finished_at = NULL WHERE id = r.id RETURNING * INTO r;
    END IF;
    IF r.state <> 'running' THEN
        RETURN;
    END IF;
    IF r.failed + r.cancelled > 0 AND NOT r.forced THEN
        UPDATE queueworker.runs
        SET state = 'failed', finished_at = now(),
            failure_task_id = CASE WHEN r.on_failure IS NOT NULL AND r.failure_task_id IS NULL
                                   THEN queueworker.enqueue_run_task(r.id, r.on_failure)
                                   ELSE r.failure_task_id END
        WHERE id = r.id;
    ELSIF (r.succeeded = r.expected OR r.forced AND r.succeeded + r.failed + r.cancelled = r.expected)
          AND r.success_task_id IS NULL THEN
        IF r.on_success IS NOT NULL THEN
            UPDATE queueworker.runs SET success_task_id = queueworker.enqueue_run_task(r.id, r.on_success)
            WHERE id = r.id;
        ELSE
            PERFORM queueworker.finish_run(r.id, true);
        END IF;
    END IF;
END
$$;

REVOKE EXECUTE ON FUNCTION queueworker.audit_run() FROM PUBLIC;
