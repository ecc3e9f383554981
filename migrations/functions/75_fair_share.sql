-- queueworker functions: fair share across the keys of a queue (migration 020, docs/flow-control.md).
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE). A SQL-language body is checked
-- when it is created: what it calls must come from an earlier file, or from earlier in the same
-- one. PL/pgSQL bodies are resolved when they run.
--
-- Start-time fair queueing: each task of a keyed queue that becomes claimable gets a virtual start
-- tag, and the claim takes the smallest tags first (within a priority). A key's tags continue from
-- the larger of the queue's virtual time at the task's priority (the smallest tag waiting there)
-- and the key's own last tag waiting there, 1/weight apart: so a key with a backlog of a million has tags far ahead, and a key
-- that arrives now is served within about one round (one task of each key with tasks pending,
-- `weight` of a weighted one). Every path that makes a task claimable goes through the parent's
-- statement triggers or through `tasks_active`'s insert trigger, and these tag it there: enqueue
-- (plain, COPY, enqueue_tasks, runs, cron, continued pages), promote_due (retries, delayed tasks),
-- rescue, release, hand_back, settlement of dependents, retry. The tag is the database's alone: no
-- role but the owner may write the column (docs/database-roles.sql), and the triggers overwrite
-- whatever a row came with.

-- Tags the tasks `ids` that are claimable (pending, not delayed), per (queue, key, priority) in id
-- order: each priority is a fair queue of its own (strict priority comes first, in the claim's
-- order). `stale`: those of them that carry a tag from before (a task claimed by a worker that did
-- not know its queue was keyed yet, a forged one): cleared first, so the probes below do not count
-- them; only while they are claimable: a task a claim took meanwhile (the ids of a resumed key's
-- waiting tasks are read before they are tagged) keeps its tag, by which its key's running tasks are
-- counted. Weights come from queueworker.queue_keys (1 when not set; tasks without a key: always 1).
-- PL/pgSQL with generic plans, as it runs in every enqueue into a keyed queue: a SQL-language
-- function with a SET clause is planned again at every call on Postgres 15 (0.6-0.9 ms here, for the
-- statement below), and custom plans would be too. A generic plan is made once per session, for the
-- size the table had then, and kept until an ANALYZE of the table: one made while the queue was empty
-- read the whole table in every call once it had grown (and in a batch, once per row: 3,000 tasks
-- took 4 s at a few thousand waiting). So no statement here joins `tasks_active` to anything: every
-- row is taken by its primary key (`id = ANY(...)`), every probe by its index, and sequential scans
-- are ruled out while planning (`enable_seqscan`), so the plan is the same whatever the table held
-- when it was made, and costs what the ids and their keys cost (tests/test_stale_plans.py). The rows
-- are found by their ids alone: `delayed IS NOT TRUE` says `NOT delayed` of this NOT NULL column in a
-- form that no partial index's predicate is implied by, or a plan made for an empty table would
-- read one of them (the claim's, every task waiting in the queue) in place of the primary key. The
-- tags go from the statement that computes them to the one that writes them as a jsonb object (id ->
-- tag), a lookup per row where a join would be sized by the planner.
CREATE OR REPLACE FUNCTION queueworker.tag_fair(ids bigint[], stale bigint[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off AS $$
DECLARE
    tags jsonb;
BEGIN
    IF stale IS NOT NULL THEN
        UPDATE queueworker.tasks_active t SET fair_tag = NULL
        WHERE t.id = ANY(stale) AND t.fair_tag IS NOT NULL AND t.state = 'pending' AND t.delayed IS NOT TRUE;
    END IF;
    -- A window numbers each group's rows, the first row of each group makes the group's probes (a
    -- CASE evaluates its subqueries only where its branch is taken), and a window hands the group's
    -- start and step to its other rows. The probes run before any row is updated: a probe made
    -- while an update ran would walk past the index entries that update had just added (invisible
    -- to it), and cost grew with the square of the batch.
    WITH ranked AS MATERIALIZED (
        SELECT t.id, t.queue, t.key, t.priority,
               row_number() OVER (PARTITION BY t.queue, t.key, t.priority ORDER BY t.id) AS rank
        FROM queueworker.tasks_active t
        WHERE t.id = ANY(ids) AND t.state = 'pending' AND t.delayed IS NOT TRUE
    ), probed AS MATERIALIZED (
        SELECT r.id, r.queue, r.key, r.priority, r.rank,
               CASE WHEN r.rank = 1 THEN greatest(
                   (SELECT f.fair_tag FROM queueworker.tasks_active f
                    WHERE f.queue = r.queue AND f.priority = r.priority
                      AND f.state = 'pending' AND NOT f.delayed AND f.fair_tag IS NOT NULL
                    ORDER BY f.priority DESC, f.fair_tag, f.id LIMIT 1),
                   CASE WHEN r.key IS NULL
                        THEN (SELECT max(f.fair_tag) FROM queueworker.tasks_active f
                              WHERE f.queue = r.queue AND f.key IS NULL AND f.priority = r.priority
                                AND f.state = 'pending' AND NOT f.delayed AND f.fair_tag IS NOT NULL)
                        ELSE (SELECT max(f.fair_tag) FROM queueworker.tasks_active f
                              WHERE f.queue = r.queue AND f.key = r.key AND f.priority = r.priority
                                AND f.state = 'pending' AND NOT f.delayed AND f.fair_tag IS NOT NULL) END,
                   0) END AS start,
               CASE WHEN r.rank = 1 THEN 1.0 / coalesce(
                   (SELECT w.weight FROM queueworker.queue_keys w WHERE w.queue = r.queue AND w.key = r.key),
                   1.0) END AS step
        FROM ranked r
    )
    SELECT jsonb_object_agg(g.id::text, g.tag) INTO tags
    FROM (SELECT p.id, max(p.start) OVER w + p.rank * max(p.step) OVER w AS tag
          FROM probed p
          WINDOW w AS (PARTITION BY p.queue, p.key, p.priority)) AS g;
    IF tags IS NOT NULL THEN
        UPDATE queueworker.tasks_active t
        SET fair_tag = (tags ->> t.id::text)::float8
        WHERE t.id = ANY(ids) AND t.state = 'pending' AND t.delayed IS NOT TRUE AND tags ? t.id::text;
    END IF;
END
$$;

-- Makes `queues` keyed (their rows of queueworker.queues, created if need be; the workers hear of it
-- on channel queueworker_queues) and tags their backlog, the tasks without a key as one key. Called
-- by the insert trigger below for a queue's first keyed task, and by the trigger of
-- 76_key_limits.sql for a queue's first per-key limit (a key-limited queue is claimed in fair order).
CREATE OR REPLACE FUNCTION queueworker.make_keyed(queues text[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO queueworker.queues (name, keyed) SELECT unnest(queues), true
    ON CONFLICT (name) DO UPDATE SET keyed = true, updated_at = now();
    PERFORM pg_notify('queueworker_queues', q) FROM unnest(queues) AS q;
    PERFORM queueworker.tag_fair(
        ARRAY(SELECT t.id FROM queueworker.tasks_active t
              WHERE t.queue = ANY(queues) AND t.state = 'pending' AND NOT t.delayed),
        ARRAY(SELECT t.id FROM queueworker.tasks_active t
              WHERE t.queue = ANY(queues) AND t.state = 'pending' AND NOT t.delayed
                AND t.fair_tag IS NOT NULL));
END
$$;

-- After an insert into the parent or aimed at `tasks_active`: a queue's first keyed task makes it
-- keyed (make_keyed), and its backlog from before is tagged with it; then the claimable rows
-- inserted into queues keyed before are tagged. A statement that reaches no keyed queue costs one
-- scan of its new rows for a key and one probe of `queues_keyed`.
CREATE OR REPLACE FUNCTION queueworker.fair_tag_inserts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    newly_keyed text[];
BEGIN
    IF EXISTS (SELECT FROM new_rows n WHERE n.key IS NOT NULL) THEN
        SELECT array_agg(d.queue ORDER BY d.queue) INTO newly_keyed
        FROM (SELECT DISTINCT n.queue FROM new_rows n WHERE n.key IS NOT NULL) AS d
        WHERE NOT EXISTS (SELECT FROM queueworker.queues q WHERE q.name = d.queue AND q.keyed);
        IF newly_keyed IS NOT NULL THEN
            PERFORM queueworker.make_keyed(newly_keyed);
        END IF;
    END IF;
    IF NOT EXISTS (SELECT FROM queueworker.queues q WHERE q.keyed) THEN
        RETURN NULL;
    END IF;
    PERFORM queueworker.tag_fair(c.ids, c.stale)
    FROM (SELECT array_agg(n.id) AS ids, array_agg(n.id) FILTER (WHERE n.fair_tag IS NOT NULL) AS stale
          FROM new_rows n JOIN queueworker.queues q ON q.name = n.queue AND q.keyed
          WHERE n.state = 'pending' AND NOT n.delayed
            AND n.queue <> ALL(coalesce(newly_keyed, '{}'))) AS c
    WHERE c.ids IS NOT NULL;
    RETURN NULL;
END
$$;

-- After an update through the parent: the rows of keyed queues that became claimable (promoted
-- when due, retried, rescued, released, settled, a replaced schedule now due), or moved to another
-- priority while claimable (a replaced priority: tags are counted per priority), take a tag at
-- the end of the line of their key, as a new task would. A statement on no keyed queue costs one
-- probe of `queues_keyed`.
CREATE OR REPLACE FUNCTION queueworker.fair_tag_updates() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    nestloop text := current_setting('enable_nestloop');
    ids bigint[];
    stale bigint[];
BEGIN
    IF NOT EXISTS (SELECT FROM queueworker.queues q WHERE q.keyed) THEN
        RETURN NULL;
    END IF;
    -- Without nested loops: audit_task_updates (10_audit.sql) says why.
    PERFORM set_config('enable_nestloop', 'off', true);
    SELECT array_agg(n.id), array_agg(n.id) FILTER (WHERE n.fair_tag IS NOT NULL) INTO ids, stale
    FROM new_rows n
    JOIN old_rows o ON o.id = n.id
    JOIN queueworker.queues q ON q.name = n.queue AND q.keyed
    WHERE n.state = 'pending' AND NOT n.delayed
      AND (NOT (o.state = 'pending' AND NOT o.delayed) OR n.priority <> o.priority);
    PERFORM set_config('enable_nestloop', nestloop, true);
    IF ids IS NOT NULL THEN
        PERFORM queueworker.tag_fair(ids, stale);
    END IF;
    RETURN NULL;
END
$$;

-- Named to fire after the audit triggers (triggers of one event fire in name order), so a
-- producer's insert into a queue it may not use fails before anything is tagged.
DROP TRIGGER IF EXISTS tasks_fair_tag_insert ON queueworker.tasks;
CREATE TRIGGER tasks_fair_tag_insert AFTER INSERT ON queueworker.tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.fair_tag_inserts();

DROP TRIGGER IF EXISTS tasks_fair_tag_update ON queueworker.tasks;
CREATE TRIGGER tasks_fair_tag_update AFTER UPDATE ON queueworker.tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.fair_tag_updates();

-- Inserts aimed at the partition (queueworker.enqueue_tasks, for its ON CONFLICT) do not fire the
-- parent's statement triggers.
DROP TRIGGER IF EXISTS tasks_active_fair_tag_insert ON queueworker.tasks_active;
CREATE TRIGGER tasks_active_fair_tag_insert AFTER INSERT ON queueworker.tasks_active
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.fair_tag_inserts();

REVOKE EXECUTE ON FUNCTION queueworker.tag_fair(bigint[], bigint[]), queueworker.make_keyed(text[]),
                           queueworker.fair_tag_inserts(), queueworker.fair_tag_updates() FROM PUBLIC;

-- A key's settings set, changed or cleared (`queueworker limit Q --key K ...`, `pause Q --key K`,
-- `resume Q --key K`) are rows of queueworker.queue_events too, as every change of a queue's
-- settings: change `key_weight` (only its weight changed), `key_limits` (its rate, burst or cap),
-- `key_paused`, `key_resumed`, or `key_cleared` (its row removed); the detail holds the key and its
-- settings after the change (none for `key_cleared`). A row that held only a pause and goes away
-- is a resume.
CREATE OR REPLACE FUNCTION queueworker.audit_queue_key() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    change text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO queueworker.queue_events (queue, change, detail)
        VALUES (OLD.queue,
                CASE WHEN num_nonnulls(OLD.weight, OLD.rate_per_second, OLD.max_running) = 0
                     THEN 'key_resumed' ELSE 'key_cleared' END,
                jsonb_build_object('key', OLD.key));
        RETURN NULL;
    END IF;
    change := CASE
        WHEN TG_OP = 'UPDATE' AND OLD.paused_until IS NOT NULL AND NEW.paused_until IS NULL THEN 'key_resumed'
        WHEN NEW.paused_until IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.paused_until IS DISTINCT FROM NEW.paused_until)
            THEN 'key_paused'
        WHEN TG_OP = 'INSERT' AND num_nonnulls(NEW.rate_per_second, NEW.max_running) = 0 THEN 'key_weight'
        WHEN TG_OP = 'UPDATE' AND (OLD.rate_per_second, OLD.burst, OLD.max_running)
                                  IS NOT DISTINCT FROM (NEW.rate_per_second, NEW.burst, NEW.max_running)
            THEN 'key_weight'
        ELSE 'key_limits' END;
    INSERT INTO queueworker.queue_events (queue, change, detail)
    VALUES (NEW.queue, change, jsonb_strip_nulls(jsonb_build_object(
        'key', NEW.key, 'weight', NEW.weight, 'rate_per_second', NEW.rate_per_second, 'burst', NEW.burst,
        'max_running', NEW.max_running, 'paused_until', NEW.paused_until)));
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS queue_keys_audit ON queueworker.queue_keys;
CREATE TRIGGER queue_keys_audit AFTER INSERT OR UPDATE OR DELETE ON queueworker.queue_keys
    FOR EACH ROW EXECUTE FUNCTION queueworker.audit_queue_key();

REVOKE EXECUTE ON FUNCTION queueworker.audit_queue_key() FROM PUBLIC;
