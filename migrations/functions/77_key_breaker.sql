-- queueworker functions: the circuit breaker of each key and its health (migration 022,
-- docs/flow-control.md).
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE).

-- The state a key's breaker moves to on a worker's report (RECORD_KEY_OUTCOMES, worker/db/flow.sql):
-- from `state` with `streak` failures since the key's last success, the report says whether any of
-- its tasks succeeded and how many failed after the last success (`failures`). The threshold is
-- the queue's key_breaker_failures (none: the state stays). The rules of the queue's breaker
-- (RECORD_BREAKER): a half-open breaker opens again on a failure after its probe was claimed and
-- closes on a success; a closed one opens at the threshold of consecutive failures; an open one
-- stays open (outcomes of tasks claimed before it opened) until its probe is claimed.
CREATE OR REPLACE FUNCTION queueworker.key_breaker_next(queue_name text, state text, streak integer,
                                                         any_succeeded boolean, failures integer) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN threshold IS NULL THEN state
                WHEN state = 'half_open' AND now_streak > 0 THEN 'open'
                WHEN state = 'half_open' AND any_succeeded THEN 'closed'
                WHEN state = 'closed' AND now_streak >= threshold THEN 'open'
                ELSE state END
    FROM (SELECT (SELECT q.key_breaker_failures FROM queueworker.queues q WHERE q.name = queue_name) AS threshold,
                 CASE WHEN any_succeeded THEN failures ELSE streak + failures END AS now_streak) AS d
$$;

-- Every change of a key breaker's state is audited in `queueworker.queue_events` as
-- `key_breaker_open`, `key_breaker_half_open` or `key_breaker_closed`, with the key in the detail,
-- by whichever login made it (a worker's report or claim, an operator's `breaker --per-key`).
CREATE OR REPLACE FUNCTION queueworker.audit_key_breaker() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO queueworker.queue_events (queue, change, detail)
    VALUES (NEW.queue, 'key_breaker_' || NEW.breaker_state,
            jsonb_build_object('key', NEW.key, 'breaker_state', NEW.breaker_state,
                               'failure_streak', NEW.failure_streak));
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS key_state_audit_breaker_insert ON queueworker.key_state;
CREATE TRIGGER key_state_audit_breaker_insert AFTER INSERT ON queueworker.key_state
    FOR EACH ROW WHEN (NEW.breaker_state <> 'closed')
    EXECUTE FUNCTION queueworker.audit_key_breaker();
DROP TRIGGER IF EXISTS key_state_audit_breaker_update ON queueworker.key_state;
CREATE TRIGGER key_state_audit_breaker_update AFTER UPDATE ON queueworker.key_state
    FOR EACH ROW WHEN (OLD.breaker_state IS DISTINCT FROM NEW.breaker_state)
    EXECUTE FUNCTION queueworker.audit_key_breaker();

REVOKE EXECUTE ON FUNCTION queueworker.audit_key_breaker() FROM PUBLIC;
