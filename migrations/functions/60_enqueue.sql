-- queueworker functions: the producer's enqueue (`enqueue_tasks`).
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE: CREATE OR REPLACE TRIGGER cannot
-- replace a constraint trigger). A SQL-language body is checked when it is created: what it calls
-- must come from an earlier file, or from earlier in the same one. PL/pgSQL bodies are resolved
-- when they run.

-- The producer's enqueue for everything beyond a plain task: dedupe keys and prerequisites
-- (`prerequisite_ords[i]` is the 1-based position of the spec that depends on task
-- `prerequisite_ids[i]`, which must exist), for a run's partitions the run and partition number,
-- and each spec's headers and key (migration 018). A spec with prerequisites starts `blocked`; its edges are kept only if
-- it was inserted (a duplicate's holder has its own). Rows are inserted with ids taken in spec
-- order, so each spec finds its row. Aimed at `tasks_active`, whose unique index is the arbiter of
-- the ON CONFLICT: one unfinished task per (queue, dedupe key). A definer function, so the producer
-- role needs no right on the partition. Called by `enqueue_tasks` (worker/db/enqueue.sql).
-- The statement sets each row's spec hash itself (the expression of 30_unique_tasks.sql, inlined), once
-- per spec for both the row and a dedupe key by spec, so the row trigger that fills a missing one is
-- not called once per task.
-- Queue grants (15_queue_grants.sql): every spec's queue, every prerequisite's (one the login may not
-- see is no task to depend on, so it learns nothing of other queues) and every queue of a run it adds
-- partitions to must be the acting login's; a partition must be in one of its run's queues.
CREATE OR REPLACE FUNCTION queueworker.enqueue_tasks(queues text[], tasks text[], payloads jsonb[],
                                                     priorities integer[], run_afters timestamptz[],
                                                     max_attempts integer[], timeouts integer[], dedupe_keys text[],
                                                     by_spec boolean[], cancel_on_failure boolean[],
                                                     prerequisite_ords bigint[], prerequisite_ids bigint[],
                                                     run_ids bigint[], run_partitions integer[], headers jsonb[],
                                                     keys text[])
RETURNS TABLE (ord bigint, queue text, dedupe_key text, id bigint, notified bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    unknown bigint;
    misfit text;
    crowded bigint;
    patterns text[] := queueworker.queue_patterns();
BEGIN
    PERFORM queueworker.require_queues(queues);
    -- A dependent's edges are settled in its enqueue's commit: their number is bounded (as
    -- queueworker.names.MAX_PREREQUISITES bounds TaskSpec.depends_on).
    SELECT o INTO crowded FROM unnest(prerequisite_ords) AS o GROUP BY o HAVING count(*) > 1000 LIMIT 1;
    IF crowded IS NOT NULL THEN
        RAISE EXCEPTION 'task % of this enqueue has more than 1000 prerequisites', crowded
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    SELECT p INTO unknown FROM unnest(prerequisite_ids) AS p
    WHERE NOT EXISTS (SELECT 1 FROM queueworker.tasks t WHERE t.id = p AND t.queue LIKE ANY (patterns)) LIMIT 1;
    IF unknown IS NOT NULL THEN
        RAISE EXCEPTION 'there is no task % to depend on', unknown USING ERRCODE = 'foreign_key_violation';
    END IF;
    -- A run counts `expected` partitions, numbered from 0, one task each: a partition outside that
    -- range, twice, or a unique task (which could turn out to be another, not counted) would count
    -- more outcomes than the run expects, and the statement that counted them (a completion, or the
    -- rescue of every queue) would fail for good.
    -- The runs are held (FOR KEY SHARE) until this transaction ends, so retention (clean_runs) cannot
    -- delete one between this check and the insert; a partition joins only a running run.
    PERFORM FROM queueworker.runs r WHERE r.id = ANY(run_ids) ORDER BY r.id FOR KEY SHARE;
    WITH given AS (
        SELECT s.run_id, s.run_partition, s.dedupe_key, s.by_spec, s.queue
        FROM unnest(run_ids, run_partitions, dedupe_keys, by_spec, queues)
             AS s(run_id, run_partition, dedupe_key, by_spec, queue)
        WHERE s.run_id IS NOT NULL
    ), doubled AS (
        SELECT g.run_id, g.run_partition FROM given g GROUP BY g.run_id, g.run_partition HAVING count(*) > 1
    )
    SELECT format('run %s, partition %s', g.run_id, coalesce(g.run_partition::text, 'none')) INTO misfit
    FROM given g LEFT JOIN queueworker.runs r ON r.id = g.run_id
    WHERE r.id IS NULL OR r.state <> 'running' OR g.run_partition IS NULL OR g.run_partition NOT BETWEEN 0 AND r.expected - 1
       OR g.queue IS NULL OR g.queue <> ALL (coalesce(r.queues, ARRAY[g.queue]))
       -- A run of queues the login may not use is not its own (nor one started before queue grants).
       OR (patterns <> ARRAY['%'] AND (r.queues IS NULL OR EXISTS (SELECT FROM unnest(r.queues) AS q(name)
                                                                   WHERE NOT q.name LIKE ANY (patterns))))
       OR g.dedupe_key IS NOT NULL OR coalesce(g.by_spec, false)
       OR EXISTS (SELECT 1 FROM doubled d WHERE d.run_id = g.run_id AND d.run_partition = g.run_partition)
       OR EXISTS (SELECT 1 FROM queueworker.tasks t WHERE t.run_id = g.run_id AND t.run_partition = g.run_partition)
    LIMIT 1;
    IF misfit IS NOT NULL THEN
        RAISE EXCEPTION 'not a partition its run can count: %', misfit
            USING ERRCODE = 'check_violation',
                  HINT = 'a run''s partitions are numbered 0 to expected - 1, one task each, none unique, '
                         'each in one of the queues the run was started with';
    END IF;
    RETURN QUERY
    WITH specs AS MATERIALIZED (
        SELECT s.ord, s.queue, s.task, s.payload, s.priority, s.run_after, s.max_attempts, s.timeout_seconds,
               s.cancel_on_failure, s.run_id, s.run_partition, s.headers, s.key,
               nextval('queueworker.tasks_id_seq') AS new_id,
               h.spec_hash,
               CASE WHEN s.by_spec THEN encode(h.spec_hash, 'hex') ELSE s.dedupe_key END AS dedupe_key,
               s.ord = ANY(prerequisite_ords) AS blocked
        FROM unnest(queues, tasks, payloads, priorities, run_afters, max_attempts, timeouts, dedupe_keys, by_spec,
                    cancel_on_failure, run_ids, run_partitions, headers, keys)
             WITH ORDINALITY AS s(queue, task, payload, priority, run_after, max_attempts, timeout_seconds,
                                  dedupe_key, by_spec, cancel_on_failure, run_id, run_partition, headers, key, ord)
             CROSS JOIN LATERAL (SELECT queueworker.spec_hash(s.queue, s.task, s.payload) AS spec_hash) AS h
        ORDER BY s.ord
    ), inserted AS (
        INSERT INTO queueworker.tasks_active AS t
            (id, queue, task, state, payload, priority, run_after, delayed, max_attempts, timeout_seconds, dedupe_key,
             run_id, run_partition, headers, key, spec_hash)
        OVERRIDING SYSTEM VALUE  -- the identity is the parent's: an insert aimed at a partition takes ids itself
        SELECT new_id, s.queue, s.task, CASE WHEN s.blocked THEN 'blocked' ELSE 'pending' END::queueworker.task_state,
               s.payload, s.priority, coalesce(s.run_after, now()), coalesce(s.run_after > now(), false),
               s.max_attempts, s.timeout_seconds, s.dedupe_key, s.run_id, s.run_partition, s.headers, s.key,
               s.spec_hash
        FROM specs s ORDER BY s.ord
        ON CONFLICT (queue, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING t.id, t.queue, t.run_after, t.state
    ), edges AS (
        INSERT INTO queueworker.task_dependencies (prerequisite_id, task_id, cancel_on_failure)
        SELECT DISTINCT p.prerequisite_id, s.new_id, s.cancel_on_failure
        FROM unnest(prerequisite_ords, prerequisite_ids) AS p(ord, prerequisite_id)
        JOIN specs s ON s.ord = p.ord
        JOIN inserted i ON i.id = s.new_id
    ), notified AS (
        SELECT queueworker.wake_queue(i.queue, min(i.run_after)) FROM inserted i WHERE i.state = 'pending'
        GROUP BY i.queue
    )
    SELECT s.ord, s.queue, s.dedupe_key, i.id, (SELECT count(*) FROM notified)
    FROM specs s LEFT JOIN inserted i ON i.id = s.new_id
    ORDER BY s.ord;
END
$$;

-- The versions without keys (schema version 12 to 17) and without headers (before 12) stay, for
-- producers of earlier versions during a rolling upgrade, and insert none: each calls the one above,
-- which makes every check.
CREATE OR REPLACE FUNCTION queueworker.enqueue_tasks(queues text[], tasks text[], payloads jsonb[],
                                                     priorities integer[], run_afters timestamptz[],
                                                     max_attempts integer[], timeouts integer[], dedupe_keys text[],
                                                     by_spec boolean[], cancel_on_failure boolean[],
                                                     prerequisite_ords bigint[], prerequisite_ids bigint[],
                                                     run_ids bigint[], run_partitions integer[], headers jsonb[])
RETURNS TABLE (ord bigint, queue text, dedupe_key text, id bigint, notified bigint)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM queueworker.enqueue_tasks(queues, tasks, payloads, priorities, run_afters, max_attempts, timeouts,
                                            dedupe_keys, by_spec, cancel_on_failure, prerequisite_ords,
                                            prerequisite_ids, run_ids, run_partitions, headers, NULL::text[])
$$;

CREATE OR REPLACE FUNCTION queueworker.enqueue_tasks(queues text[], tasks text[], payloads jsonb[],
                                                     priorities integer[], run_afters timestamptz[],
                                                     max_attempts integer[], timeouts integer[], dedupe_keys text[],
                                                     by_spec boolean[], cancel_on_failure boolean[],
                                                     prerequisite_ords bigint[], prerequisite_ids bigint[],
                                                     run_ids bigint[], run_partitions integer[])
RETURNS TABLE (ord bigint, queue text, dedupe_key text, id bigint, notified bigint)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM queueworker.enqueue_tasks(queues, tasks, payloads, priorities, run_afters, max_attempts, timeouts,
                                            dedupe_keys, by_spec, cancel_on_failure, prerequisite_ords,
                                            prerequisite_ids, run_ids, run_partitions, NULL::jsonb[], NULL::text[])
$$;

REVOKE EXECUTE ON FUNCTION
    queueworker.enqueue_tasks(text[], text[], jsonb[], integer[], timestamptz[], integer[], integer[], text[],
                              boolean[], boolean[], bigint[], bigint[], bigint[], integer[], jsonb[], text[]),
    queueworker.enqueue_tasks(text[], text[], jsonb[], integer[], timestamptz[], integer[], integer[], text[],
                              boolean[], boolean[], bigint[], bigint[], bigint[], integer[], jsonb[]),
    queueworker.enqueue_tasks(text[], text[], jsonb[], integer[], timestamptz[], integer[], integer[], text[],
                              boolean[], boolean[], bigint[], bigint[], bigint[], integer[])
FROM PUBLIC;
