-- queueworker functions: dependencies between tasks (`queueworker.task_dependencies`).
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE: CREATE OR REPLACE TRIGGER cannot
-- replace a constraint trigger). A SQL-language body is checked when it is created: what it calls
-- must come from an earlier file, or from earlier in the same one. PL/pgSQL bodies are resolved
-- when they run.

-- A task enqueued with prerequisites starts `blocked`: unclaimable, counted apart. It becomes
-- `pending` when every prerequisite has succeeded, in the statement that records the last success;
-- it is `cancelled` (error type DependencyFailed, naming the prerequisite) when one ends failed or
-- cancelled, unless its edge says to run anyway; retrying that prerequisite re-blocks what its end
-- cancelled. Cancellation and re-blocking carry on down the graph. Workers never advance
-- downstream work and the orchestration never marks work done: the database moves dependents only
-- from `blocked` (or a cancellation it made itself), as prerequisites finish.
--
-- Counts, not re-judgements (migration 013). Each edge records what it counts for its dependent
-- (`counted`: 'waiting' while its prerequisite is unfinished, 'failed' once it ended failed or
-- cancelled on a `cancel` edge, else 'done'; NULL until the commit that added it), and each
-- dependent that is `blocked` or DependencyFailed keeps the sums (`prerequisites_waiting`,
-- `prerequisites_failed`). Settling an edge compares what it counts with its prerequisite's state
-- now and moves the difference into its dependent's sums, whose verdict is then immediate: any
-- failed, `cancelled`; none waiting, `pending`; else `blocked`. A prerequisite's end touches its
-- own edges and their dependents only, so the cost is the edges touched. Settling is idempotent
-- (it trusts no caller's word about a state), so settling an edge twice changes nothing.
--
-- Who settles an edge, and why none is missed. A prerequisite's end and a new dependent's
-- enqueue may happen in two transactions at once, each unable to see the other. Both sides meet
-- at the prerequisite's row, and nowhere else: no lock is global. A statement that changes a
-- task's state holds its row lock (every change between unfinished and ended moves the row
-- between the partitions: a delete) and settles the edges it can see in a later statement. A
-- transaction that added a dependent settles its edges at its commit (a deferred constraint
-- trigger), after taking FOR KEY SHARE on each prerequisite in id order, which waits for a
-- transaction ending that prerequisite and makes a later one wait for this commit; the states are
-- then read in a new statement. Whichever comes second sees the other's work. The lock is held
-- only while that transaction commits, so an application's long transaction holds up no worker
-- (unless it asks for the check at once with SET CONSTRAINTS ... IMMEDIATE: then its own
-- prerequisites wait for its commit, and nothing else). Workers write a batch's outcomes in id
-- order too, which makes a circle of waits between the two rare (and harmless: see
-- settle_new_dependent).

-- What an edge counts for its dependent, given its prerequisite's state (NULL: no such task any
-- more, deleted by the retention after it ended: it has had its say).
CREATE OR REPLACE FUNCTION queueworker.counted_as(prerequisite_state queueworker.task_state,
                                                  cancel_on_failure boolean)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN prerequisite_state IN ('blocked', 'pending', 'running', 'retrying') THEN 'waiting'
                WHEN prerequisite_state IN ('failed', 'cancelled') AND cancel_on_failure THEN 'failed'
                ELSE 'done' END
$$;

-- The state a dependent's sums call for.
CREATE OR REPLACE FUNCTION queueworker.dependency_verdict(waiting integer, failed integer)
RETURNS queueworker.task_state LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN failed > 0 THEN 'cancelled' WHEN waiting = 0 THEN 'pending' ELSE 'blocked' END
           ::queueworker.task_state
$$;

-- Settles the edges out of `prerequisites` and the edges into `dependents` whose dependent is
-- `blocked` or DependencyFailed: brings each edge's count up to date with its prerequisite's
-- state as this statement sees it, and each such dependent's sums and state with them. Returns
-- the dependents that moved between unfinished and ended (into or out of `cancelled`), whose own
-- edges are to be settled in turn. The caller holds the prerequisites' rows (see above).
CREATE OR REPLACE FUNCTION queueworker.settle_edges(prerequisites bigint[], dependents bigint[]) RETURNS bigint[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    moved_ids bigint[];
    waiting_deltas integer[];
    failed_deltas integer[];
    onward bigint[];
BEGIN
    -- The edges are found from the ids given, through the two indexes of the edges (a plan that
    -- scanned every blocked task instead would make each settlement cost the whole graph).
    WITH candidate AS MATERIALIZED (
        SELECT d.prerequisite_id, d.task_id, d.cancel_on_failure, d.counted
        FROM queueworker.task_dependencies d WHERE d.prerequisite_id = ANY(prerequisites)
        UNION ALL
        SELECT d.prerequisite_id, d.task_id, d.cancel_on_failure, d.counted
        FROM queueworker.task_dependencies d WHERE d.task_id = ANY(dependents) AND d.prerequisite_id <> ALL(prerequisites)
    ), edge AS (
        SELECT c.prerequisite_id, c.task_id, c.counted AS was,
               queueworker.counted_as(p.state, c.cancel_on_failure) AS now_counted
        FROM candidate c
        JOIN queueworker.tasks t ON t.id = c.task_id
        LEFT JOIN queueworker.tasks p ON p.id = c.prerequisite_id
        WHERE t.state = 'blocked' OR (t.state = 'cancelled' AND t.error ->> 'type' = 'DependencyFailed')
    ), recounted AS (
        UPDATE queueworker.task_dependencies d SET counted = e.now_counted
        FROM edge e
        WHERE (d.prerequisite_id = ANY(prerequisites) OR d.task_id = ANY(dependents))  -- by the indexes, again
          AND d.prerequisite_id = e.prerequisite_id AND d.task_id = e.task_id
          AND d.counted IS DISTINCT FROM e.now_counted
        RETURNING d.task_id, e.was, e.now_counted
    )
    SELECT array_agg(task_id ORDER BY task_id), array_agg(waiting ORDER BY task_id),
           array_agg(failed ORDER BY task_id)
    INTO moved_ids, waiting_deltas, failed_deltas
    FROM (SELECT task_id,
                 sum((now_counted = 'waiting')::integer - (was IS NOT DISTINCT FROM 'waiting')::integer) AS waiting,
                 sum((now_counted = 'failed')::integer - (was IS NOT DISTINCT FROM 'failed')::integer) AS failed
          FROM recounted GROUP BY task_id) AS delta;
    IF moved_ids IS NULL THEN
        RETURN '{}';
    END IF;
    -- The dependents, locked in id order (concurrent settlements never wait in a circle), with
    -- their states as locked; each one's new sums are its latest row's plus the deltas.
    WITH locked AS MATERIALIZED (
        SELECT t.id, t.state FROM queueworker.tasks t
        WHERE t.id = ANY(moved_ids)
          AND (t.state = 'blocked' OR (t.state = 'cancelled' AND t.error ->> 'type' = 'DependencyFailed'))
        ORDER BY t.id
        FOR NO KEY UPDATE OF t
    ), change AS (
        SELECT c.id, c.waiting, c.failed, l.state AS old_state
        FROM unnest(moved_ids, waiting_deltas, failed_deltas) AS c(id, waiting, failed)
        JOIN locked l ON l.id = c.id
    ), changed AS (
        UPDATE queueworker.tasks t
        SET prerequisites_waiting = t.prerequisites_waiting + c.waiting,
            prerequisites_failed = t.prerequisites_failed + c.failed,
            state = queueworker.dependency_verdict(t.prerequisites_waiting + c.waiting,
                                                   t.prerequisites_failed + c.failed),
            error = CASE WHEN t.prerequisites_failed + c.failed = 0 THEN NULL
                         WHEN t.state = 'cancelled' AND EXISTS (
                             SELECT FROM queueworker.task_dependencies k
                             WHERE k.task_id = t.id AND k.counted = 'failed'
                               AND k.prerequisite_id = (t.error ->> 'prerequisite')::bigint) THEN t.error
                         ELSE (SELECT jsonb_build_object(
                                   'type', 'DependencyFailed', 'prerequisite', p.id, 'root', r.root, 'retryable', false,
                                   'message', format('prerequisite task %s ended %s', p.id, p.state)
                                              || CASE WHEN r.root <> p.id
                                                      THEN format(' (after task %s ended)', r.root) ELSE '' END)
                               FROM queueworker.task_dependencies k
                               JOIN queueworker.tasks p ON p.id = k.prerequisite_id,
                               LATERAL (SELECT coalesce(CASE WHEN p.error ->> 'type' = 'DependencyFailed'
                                                             THEN (p.error ->> 'root')::bigint END, p.id) AS root) r
                               WHERE k.task_id = t.id AND k.counted = 'failed'
                               ORDER BY k.prerequisite_id LIMIT 1) END,
            finished_at = CASE WHEN t.prerequisites_failed + c.failed = 0 THEN NULL
                               WHEN t.state = 'cancelled' THEN t.finished_at ELSE now() END,
            delayed = CASE WHEN t.prerequisites_failed + c.failed = 0 AND t.prerequisites_waiting + c.waiting = 0
                           THEN t.run_after > now() ELSE t.delayed END,
            updated_at = now()
        FROM change c
        WHERE t.id = ANY(moved_ids) AND t.id = c.id
        RETURNING t.id, t.queue, t.state, t.run_after, c.old_state
    ), woken AS (
        SELECT queueworker.wake_queue(queue, min(run_after)) FROM changed
        WHERE state = 'pending' AND old_state <> 'pending' GROUP BY queue
    )
    SELECT array_agg(id) FILTER (WHERE (state = 'cancelled') <> (old_state = 'cancelled'))
    INTO onward
    FROM changed, (SELECT count(*) FROM woken) AS w;
    RETURN coalesce(onward, '{}');
END
$$;

-- Settles the edges given and, as far as their changes reach, the edges of the dependents that
-- moved, level by level (a loop, not a recursion: a cancelled chain may be 10,000 long). Marks the
-- transaction as settling meanwhile, so the update trigger's own call (audit_task_updates,
-- 10_audit.sql) does not repeat it. Without JIT: compiling the plans of a big settlement (and of
-- the audit trigger it fires) took longer than running them, 3 of the 4.7 s that releasing
-- 20,000 dependents took.
CREATE OR REPLACE FUNCTION queueworker.settle_cascade(prerequisites bigint[], dependents bigint[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET jit = off AS $$
DECLARE
    outer_setting text := coalesce(current_setting('queueworker.settling', true), '');
BEGIN
    PERFORM set_config('queueworker.settling', 'on', true);
    prerequisites := queueworker.settle_edges(prerequisites, dependents);
    WHILE cardinality(prerequisites) > 0 LOOP
        prerequisites := queueworker.settle_edges(prerequisites, '{}');
    END LOOP;
    PERFORM set_config('queueworker.settling', outer_setting, true);
END
$$;

-- The finishing side: called by every statement that ends tasks (or undoes an end), with the tasks
-- it changed, whose rows it holds. Cheap when nothing depends on them: one index probe. A definer
-- function the worker may call with any ids: it settles against the states it reads, never the
-- caller's word, so wrong ids cost a probe and change nothing. It and the enqueueing side below
-- plan without sequential scans: a session that keeps its plans (an operator's console cancelling
-- tasks, a worker through a pooler) would otherwise read the tables whole once they grew past the
-- size it planned for (docs/architecture.md, "A generic plan must not depend on the table's size").
CREATE OR REPLACE FUNCTION queueworker.settle_dependents(prerequisites bigint[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
BEGIN
    IF coalesce(cardinality(prerequisites), 0) = 0 OR NOT EXISTS (
            SELECT FROM queueworker.task_dependencies d WHERE d.prerequisite_id = ANY(prerequisites)) THEN
        RETURN;
    END IF;
    PERFORM queueworker.settle_cascade(prerequisites, '{}');
END
$$;

-- Version 12's signature, which its workers' completions call during a rolling upgrade: what they
-- say succeeded is read from the database like everything else.
CREATE OR REPLACE FUNCTION queueworker.settle_dependents(prerequisites bigint[], succeeded bigint[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT queueworker.settle_dependents(prerequisites)
$$;

-- The enqueueing side: at the commit of a transaction that added dependents. The trigger fires
-- once per dependent; the first call settles every dependent of the transaction (those whose
-- edges count nothing yet: other transactions' uncommitted edges are invisible here, and every
-- committed edge has been counted at its commit), so the later calls find theirs settled and
-- return. Takes FOR KEY SHARE on their prerequisites in id order (see above); one that a
-- concurrent update moved to the other partition meanwhile makes the lock fail with SQLSTATE
-- 40001, and is looked up again where it went, in a new statement. A completion that locks
-- several of them in another order may wait for this lock while this waits for it: Postgres then
-- fails one of the two, and if it is this one, it lets go of what it holds and takes the locks
-- again, so the enqueue commits all the same. A dependent that is no longer blocked at its commit
-- (cancelled in the same transaction) has nothing to count.
CREATE OR REPLACE FUNCTION queueworker.settle_new_dependent() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
    fresh bigint[];
BEGIN
    IF NOT EXISTS (SELECT FROM queueworker.task_dependencies d WHERE d.task_id = NEW.id AND d.counted IS NULL) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(DISTINCT d.task_id) INTO fresh FROM queueworker.task_dependencies d WHERE d.counted IS NULL;
    LOOP
        BEGIN
            PERFORM FROM (
                SELECT p.id FROM queueworker.tasks p
                WHERE p.id IN (SELECT d.prerequisite_id FROM queueworker.task_dependencies d
                               WHERE d.task_id = ANY(fresh))
                ORDER BY p.id
                FOR KEY SHARE OF p) AS prerequisites;
            EXIT;
        EXCEPTION WHEN serialization_failure OR deadlock_detected THEN
            NULL;  -- its locks are released with the block: wait again, in a new statement
        END;
    END LOOP;
    PERFORM queueworker.settle_cascade('{}', fresh);
    UPDATE queueworker.task_dependencies d SET counted = 'done' WHERE d.task_id = ANY(fresh) AND d.counted IS NULL;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS tasks_active_settle_new_dependent ON queueworker.tasks_active;
CREATE CONSTRAINT TRIGGER tasks_active_settle_new_dependent AFTER INSERT ON queueworker.tasks_active
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.state = 'blocked')
    EXECUTE FUNCTION queueworker.settle_new_dependent();

REVOKE EXECUTE ON FUNCTION queueworker.settle_dependents(bigint[]),
                           queueworker.settle_dependents(bigint[], bigint[])
FROM PUBLIC;
