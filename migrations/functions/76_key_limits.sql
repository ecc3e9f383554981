-- queueworker functions: per-key limits and per-key pause (migration 021, docs/flow-control.md).
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE). PL/pgSQL bodies are resolved
-- when they run.

-- `queues.key_limits`: whether some key of the queue has a limit or a pause of its own (a row of
-- queue_keys with a rate, a cap or paused_until). Kept here, for every change of queue_keys however
-- made, since a generated column cannot look at another table. A queue without a row gets one
-- (its audit row is queue_keys'). Only an operator's change of a key's settings runs this: the
-- keys with settings of one queue are read through the primary key.
CREATE OR REPLACE FUNCTION queueworker.note_key_limits() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    queue_name text := CASE WHEN TG_OP = 'DELETE' THEN OLD.queue ELSE NEW.queue END;
    has_limits boolean;
BEGIN
    has_limits := EXISTS (SELECT FROM queueworker.queue_keys k
                          WHERE k.queue = queue_name
                            AND num_nonnulls(k.rate_per_second, k.max_running, k.paused_until) > 0);
    IF has_limits THEN
        INSERT INTO queueworker.queues AS q (name, key_limits) VALUES (queue_name, true)
        ON CONFLICT (name) DO UPDATE SET key_limits = true, updated_at = now() WHERE NOT q.key_limits;
    ELSE
        UPDATE queueworker.queues SET key_limits = false, updated_at = now()
        WHERE name = queue_name AND key_limits;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS queue_keys_note_limits ON queueworker.queue_keys;
CREATE TRIGGER queue_keys_note_limits AFTER INSERT OR UPDATE OR DELETE ON queueworker.queue_keys
    FOR EACH ROW EXECUTE FUNCTION queueworker.note_key_limits();

-- A key-limited queue is keyed: its first per-key limit (a default, or a key's own) makes it so and
-- tags its backlog (make_keyed, 75_fair_share.sql), as its first keyed task would, so its workers
-- claim it in fair order, where a held key loses its turn. Named to fire after the audit triggers.
CREATE OR REPLACE FUNCTION queueworker.key_limited_queue_keyed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM queueworker.make_keyed(ARRAY[NEW.name]);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS queues_keyed_when_key_limited ON queueworker.queues;
CREATE TRIGGER queues_keyed_when_key_limited AFTER INSERT OR UPDATE ON queueworker.queues
    FOR EACH ROW WHEN (NEW.key_limited AND NOT NEW.keyed)
    EXECUTE FUNCTION queueworker.key_limited_queue_keyed();

-- A paused key's tasks keep their place in line, and the queue's virtual time (the smallest tag
-- waiting) stays at the first of them while it is paused: when the pause ends they would all come
-- ahead of every other key's, a burst of the whole backlog the key had. So when a key's pause ends
-- (`resume Q --key K`, or a timed pause's end, below), its waiting tasks take their place anew
-- behind the current virtual time of the other keys, as if they had just arrived: tag_fair clears
-- their old tags first, so they do not count in its probes. Once per pause, O(the key's backlog).
CREATE OR REPLACE FUNCTION queueworker.retag_resumed_key() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    waiting bigint[];
BEGIN
    waiting := ARRAY(SELECT t.id FROM queueworker.tasks_active t
                     WHERE t.queue = OLD.queue AND t.key = OLD.key AND t.state = 'pending' AND NOT t.delayed
                     ORDER BY t.id);
    IF cardinality(waiting) > 0 AND EXISTS (SELECT FROM queueworker.queues q WHERE q.name = OLD.queue AND q.keyed) THEN
        PERFORM queueworker.tag_fair(waiting, waiting);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS queue_keys_resumed_retag ON queueworker.queue_keys;
CREATE TRIGGER queue_keys_resumed_retag AFTER UPDATE ON queueworker.queue_keys
    FOR EACH ROW WHEN (OLD.paused_until IS NOT NULL AND NEW.paused_until IS NULL)
    EXECUTE FUNCTION queueworker.retag_resumed_key();
DROP TRIGGER IF EXISTS queue_keys_removed_retag ON queueworker.queue_keys;
CREATE TRIGGER queue_keys_removed_retag AFTER DELETE ON queueworker.queue_keys
    FOR EACH ROW WHEN (OLD.paused_until IS NOT NULL)
    EXECUTE FUNCTION queueworker.retag_resumed_key();

-- LOCK_KEYS (worker/db/lease.sql), the first statement of a claim of a key-limited queue: locks the
-- queue's row, as LOCK_QUEUE does (CLAIM_KEYS comes in a statement of its own, with a snapshot
-- taken after the lock), then ends the key pauses whose time has passed (`pause Q --key K --for D`),
-- so that their tasks take their place in line anew (above) and the workers see them resumed. It
-- ends only pauses already over, whoever calls it: the worker role may, and no other.
--
-- `knows_key_breakers`: the claim that follows passes over the keys whose breaker is open (schema
-- version 22). The workers of version 21 call the one-argument form, and their CLAIM_KEYS knows
-- nothing of per-key breakers: for a queue that has them, the transaction is marked
-- (`queueworker.blind_key_claim`, transaction-local), and the row trigger below skips every row its
-- claim would take. A login that sets the mark itself only stops its own claims.
-- Generic plans for its own statements: it runs at every claim of the queue, on worker sessions that
-- force custom plans, and the statements after its lock would otherwise be planned under it each
-- time (tests/test_nested_plans.py). Planned without sequential scans, so that a plan made while the
-- queue had few keys with settings of their own reads the pauses by index once it has many
-- (tests/test_stale_plans.py).
CREATE OR REPLACE FUNCTION queueworker.lock_key_limited_queue(queue_name text, knows_key_breakers boolean)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off AS $$
DECLARE
    has_key_breaker boolean;
BEGIN
    SELECT q.key_breaker_failures IS NOT NULL INTO has_key_breaker
    FROM queueworker.queues q WHERE q.name = queue_name FOR NO KEY UPDATE;
    IF has_key_breaker AND knows_key_breakers IS NOT TRUE THEN  -- NULL is not knowing
        PERFORM set_config('queueworker.blind_key_claim', 'on', true);
    END IF;
    IF EXISTS (SELECT FROM queueworker.queue_keys k
               WHERE k.queue = queue_name AND k.paused_until IS NOT NULL AND k.paused_until <= now()) THEN
        DELETE FROM queueworker.queue_keys k
        WHERE k.queue = queue_name AND k.paused_until IS NOT NULL AND k.paused_until <= now()
          AND num_nonnulls(k.weight, k.rate_per_second, k.max_running) = 0;
        UPDATE queueworker.queue_keys k SET paused_until = NULL, updated_at = now()
        WHERE k.queue = queue_name AND k.paused_until IS NOT NULL AND k.paused_until <= now();
    END IF;
END
$$;

-- The form the workers of schema version 21 call.
CREATE OR REPLACE FUNCTION queueworker.lock_key_limited_queue(queue_name text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT queueworker.lock_key_limited_queue(queue_name, false)
$$;

-- A worker of an earlier version claims a keyed queue with CLAIM_FAIR or CLAIM_LIMITED_FAIR, which
-- clear a claimed task's tag, or, before it has heard the queue is keyed, with CLAIM_LIMITED, which
-- keeps it as it was; the claims of this version negate it. Such a claim knows nothing of per-key
-- limits: from a key-limited queue it takes nothing (the row is skipped, so it is neither claimed
-- nor audited), and a rolling upgrade cannot overshoot a key's limit. The WHEN is evaluated per row
-- claimed, without a call: a plain queue's tasks have no tag, and pay nothing more. A task without a
-- tag (made claimable by a transaction that had not seen its queue become keyed) cannot be told
-- apart: docs/flow-control.md says when that happens. A CLAIM_KEYS of schema version 21, blind to
-- per-key breakers, negates the tag as this version's does: its transaction was marked by
-- lock_key_limited_queue (above), and the WHEN reads the mark without a call.
CREATE OR REPLACE FUNCTION queueworker.refuse_claims_blind_to_key_limits() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF current_setting('queueworker.blind_key_claim', true) = 'on'
       OR EXISTS (SELECT FROM queueworker.queues q WHERE q.name = NEW.queue AND q.key_limited) THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS tasks_active_claims_blind_to_key_limits ON queueworker.tasks_active;
CREATE TRIGGER tasks_active_claims_blind_to_key_limits BEFORE UPDATE ON queueworker.tasks_active
    FOR EACH ROW
    WHEN (OLD.state = 'pending' AND NEW.state = 'running' AND OLD.fair_tag IS NOT NULL
          AND (NEW.fair_tag IS NULL OR NEW.fair_tag > 0
               OR current_setting('queueworker.blind_key_claim', true) = 'on'))
    EXECUTE FUNCTION queueworker.refuse_claims_blind_to_key_limits();

REVOKE EXECUTE ON FUNCTION queueworker.note_key_limits(), queueworker.key_limited_queue_keyed(),
                           queueworker.retag_resumed_key(), queueworker.lock_key_limited_queue(text),
                           queueworker.lock_key_limited_queue(text, boolean),
                           queueworker.refuse_claims_blind_to_key_limits() FROM PUBLIC;
