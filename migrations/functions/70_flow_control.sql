-- queueworker functions: flow control per queue (`queueworker.queues`, `queue_events`).
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE: CREATE OR REPLACE TRIGGER cannot
-- replace a constraint trigger). A SQL-language body is checked when it is created: what it calls
-- must come from an earlier file, or from earlier in the same one. PL/pgSQL bodies are resolved
-- when they run.

-- Every change of a queue's settings or of its breaker's state is audited in
-- `queueworker.queue_events` (who, what, the row after) by these triggers.
CREATE OR REPLACE FUNCTION queueworker.audit_queue() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    change text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO queueworker.queue_events (queue, change, detail) VALUES (OLD.name, 'cleared', '{}');
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' AND NOT NEW.keyed
       AND num_nonnulls(NEW.paused_until, NEW.rate_per_second, NEW.max_running, NEW.breaker_failures,
                        NEW.key_rate_per_second, NEW.key_max_running, NEW.key_breaker_failures) = 0 THEN
        RETURN NULL;  -- made for a key's own limit (76_key_limits.sql): queue_keys' audit has it
    END IF;
    change := CASE
        -- its first task with a key (75_fair_share.sql); the ON CONFLICT path changes nothing else
        WHEN NEW.keyed AND ((TG_OP = 'INSERT' AND NOT NEW.limited) OR (TG_OP = 'UPDATE' AND NOT OLD.keyed))
            THEN 'keyed'
        WHEN TG_OP = 'UPDATE' AND OLD.breaker_state IS DISTINCT FROM NEW.breaker_state
            THEN 'breaker_' || NEW.breaker_state
        WHEN TG_OP = 'UPDATE' AND OLD.paused_until IS NOT NULL AND NEW.paused_until IS NULL THEN 'resumed'
        WHEN NEW.paused_until IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.paused_until IS DISTINCT FROM NEW.paused_until)
            THEN 'paused'
        ELSE 'limits' END;
    INSERT INTO queueworker.queue_events (queue, change, detail)
    VALUES (NEW.name, change, jsonb_strip_nulls(jsonb_build_object(
        'paused_until', NEW.paused_until, 'rate_per_second', NEW.rate_per_second, 'burst', NEW.burst,
        'max_running', NEW.max_running, 'breaker_failures', NEW.breaker_failures,
        'breaker_cooldown_seconds', NEW.breaker_cooldown_seconds, 'breaker_state', NEW.breaker_state,
        'consecutive_failures', NEW.consecutive_failures, 'keyed', NULLIF(NEW.keyed, false),
        'key_rate_per_second', NEW.key_rate_per_second, 'key_burst', NEW.key_burst,
        'key_max_running', NEW.key_max_running, 'key_breaker_failures', NEW.key_breaker_failures,
        'key_breaker_cooldown_seconds', NEW.key_breaker_cooldown_seconds)));
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS queues_audit_insert ON queueworker.queues;
CREATE TRIGGER queues_audit_insert AFTER INSERT OR DELETE ON queueworker.queues
    FOR EACH ROW EXECUTE FUNCTION queueworker.audit_queue();
DROP TRIGGER IF EXISTS queues_audit_update ON queueworker.queues;
CREATE TRIGGER queues_audit_update AFTER UPDATE ON queueworker.queues
    FOR EACH ROW
    WHEN ((OLD.paused_until, OLD.rate_per_second, OLD.burst, OLD.max_running, OLD.breaker_failures,
           OLD.breaker_cooldown_seconds, OLD.breaker_state, OLD.key_rate_per_second, OLD.key_burst,
           OLD.key_max_running, OLD.key_breaker_failures, OLD.key_breaker_cooldown_seconds)
          IS DISTINCT FROM
          (NEW.paused_until, NEW.rate_per_second, NEW.burst, NEW.max_running, NEW.breaker_failures,
           NEW.breaker_cooldown_seconds, NEW.breaker_state, NEW.key_rate_per_second, NEW.key_burst,
           NEW.key_max_running, NEW.key_breaker_failures, NEW.key_breaker_cooldown_seconds)
          OR (NOT OLD.keyed AND NEW.keyed))
    EXECUTE FUNCTION queueworker.audit_queue();

-- Append-only, like task_events (forbid_event_updates, 10_audit.sql).
DROP TRIGGER IF EXISTS queue_events_append_only ON queueworker.queue_events;
CREATE TRIGGER queue_events_append_only BEFORE UPDATE ON queueworker.queue_events
    FOR EACH ROW EXECUTE FUNCTION queueworker.forbid_event_updates();
DROP TRIGGER IF EXISTS queue_events_no_truncate ON queueworker.queue_events;
CREATE TRIGGER queue_events_no_truncate BEFORE TRUNCATE ON queueworker.queue_events
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.forbid_event_updates();

REVOKE EXECUTE ON FUNCTION queueworker.audit_queue() FROM PUBLIC;
