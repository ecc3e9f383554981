-- queueworker functions: unique tasks (the spec hash, and replacing a pending task).
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE: CREATE OR REPLACE TRIGGER cannot
-- replace a constraint trigger). A SQL-language body is checked when it is created: what it calls
-- must come from an earlier file, or from earlier in the same one. PL/pgSQL bodies are resolved
-- when they run.

-- `spec_hash`: SHA-256 of the canonical JSON of (queue, task, payload), computed by the database
-- for every row however it was inserted, so producers in any language agree. "Canonical" is
-- jsonb's own text form: keys sorted and duplicates removed, whitespace normalised. This function
-- computes it for a lookup; migration 004 filled the rows of its day with the same expression.
-- STABLE, as the functions it calls are (jsonb_build_array and convert_to): Postgres inlines a SQL
-- function only when its body is no more volatile than declared, so a statement (or a trigger's
-- expression) computes the expression itself instead of calling a function per row, which cost a
-- bulk insert about as much again as the hash. Nothing indexes it, so IMMUTABLE bought nothing.
CREATE OR REPLACE FUNCTION queueworker.spec_hash(queue text, task text, payload jsonb) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.sha256(pg_catalog.convert_to(pg_catalog.jsonb_build_array(queue, task, payload)::text, 'UTF8'))
$$;

-- Row triggers fill the column when a task is inserted without one and when an unfinished task's
-- queue, task or payload change; a row moving between partitions keeps its value. (A bulk load with
-- triggers disabled must set it itself.) Not a stored generated column: Postgres recomputes those
-- on every UPDATE (each claim and heartbeat) and on the move to `tasks_finished`, which cost the hot
-- path about a sixth of its throughput.
CREATE OR REPLACE FUNCTION queueworker.fill_spec_hash() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.spec_hash := queueworker.spec_hash(NEW.queue, NEW.task, NEW.payload);
    RETURN NEW;
END
$$;

-- Row triggers of a partition fire for inserts routed through the parent too. A row that brings its
-- hash along (a completion or a retry moving it between partitions) is not even passed to the
-- function: the WHEN condition is checked first, without a call.
DROP TRIGGER IF EXISTS tasks_active_spec_hash ON queueworker.tasks_active;
CREATE TRIGGER tasks_active_spec_hash BEFORE INSERT ON queueworker.tasks_active
    FOR EACH ROW WHEN (NEW.spec_hash IS NULL) EXECUTE FUNCTION queueworker.fill_spec_hash();
DROP TRIGGER IF EXISTS tasks_finished_spec_hash ON queueworker.tasks_finished;
CREATE TRIGGER tasks_finished_spec_hash BEFORE INSERT ON queueworker.tasks_finished
    FOR EACH ROW WHEN (NEW.spec_hash IS NULL) EXECUTE FUNCTION queueworker.fill_spec_hash();
-- Claims and heartbeats set none of these columns, so they never fire it.
DROP TRIGGER IF EXISTS tasks_active_spec_changed ON queueworker.tasks_active;
CREATE TRIGGER tasks_active_spec_changed BEFORE UPDATE OF queue, task, payload ON queueworker.tasks_active
    FOR EACH ROW EXECUTE FUNCTION queueworker.fill_spec_hash();

-- What a producer may do with unique tasks is done by definer functions, so the producer role needs
-- no right on the `tasks_active` partition (whose unique index the ON CONFLICT needs) nor a general
-- UPDATE on tasks: enqueue_tasks (60_enqueue.sql) inserts, this one replaces.
-- Gives pending tasks that have a dedupe key new values (the last of an id's entries wins), where
-- they change anything; returns the ids changed. Only tasks of queues the acting login may use (queue
-- grants, 15_queue_grants.sql): another's is to it a task that does not exist, and is left alone.
-- Called by `enqueue_replace` (worker/db/enqueue.sql).
CREATE OR REPLACE FUNCTION queueworker.replace_pending(ids bigint[], payloads jsonb[], priorities integer[],
                                                       run_afters timestamptz[])
RETURNS TABLE (id bigint, notified bigint)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH r AS (
        SELECT DISTINCT ON (r.id) r.id, r.payload, r.priority, r.run_after
        FROM unnest(ids, payloads, priorities, run_afters) WITH ORDINALITY AS r(id, payload, priority, run_after, ord)
        ORDER BY r.id, r.ord DESC
    ), replaced AS (
        UPDATE queueworker.tasks t
        SET payload = r.payload, priority = r.priority, run_after = coalesce(r.run_after, least(t.run_after, now())),
            delayed = coalesce(r.run_after > now(), false), updated_at = now()
        FROM r
        WHERE t.id = r.id AND t.state = 'pending' AND t.dedupe_key IS NOT NULL
          AND t.queue LIKE ANY ((SELECT queueworker.queue_patterns())::text[])
          AND (t.payload IS DISTINCT FROM r.payload OR t.priority IS DISTINCT FROM r.priority
               OR t.run_after IS DISTINCT FROM coalesce(r.run_after, least(t.run_after, now())))
        RETURNING t.id, t.queue, t.run_after
    ), notified AS (
        SELECT queueworker.wake_queue(queue, min(run_after)) FROM replaced GROUP BY queue
    )
    SELECT id, (SELECT count(*) FROM notified) FROM replaced ORDER BY id
$$;

-- The task holding each key, for the specs enqueue_tasks did not insert: the unfinished one, else
-- (it finished since) the one that finished last; `ord` is the spec's. A definer function, so the
-- producer needs no read of `state` and `dedupe_key` (which would show it every queue's keys); the
-- queues must be the acting login's. Called by `enqueue_existing` (worker/db/enqueue.sql), a new
-- statement after the insert, so it sees the duplicate that the insert waited for.
-- The unfinished holder is one probe of the unique index tasks_dedupe. Only when it is gone (it
-- finished between the insert and this statement) are the finished tasks read, the last finished
-- first, down `tasks_finished_at` until the first that holds the key, which is among the last few:
-- they have no index on the key, and a lookup of both partitions at once read every finished task
-- of the history for each duplicate (40,000 rows, 10 ms, for one duplicate enqueue;
-- tests/test_stale_plans.py). Ordered by that index's column alone, so the scan stops at the
-- first match (a task ended without a `finished_at`, by hand, comes first). Without sequential
-- scans, so that a plan the session keeps from when the tables were small still reads by index
-- (docs/architecture.md, "A generic plan must not depend on the table's size").
CREATE OR REPLACE FUNCTION queueworker.existing_tasks(ords bigint[], queues text[], dedupe_keys text[])
RETURNS TABLE (ord bigint, id bigint, state text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
BEGIN
    PERFORM queueworker.require_queues(queues);
    RETURN QUERY
    SELECT k.ord, coalesce(a.id, f.id), coalesce(a.state, f.state)::text
    FROM unnest(ords, queues, dedupe_keys) AS k(ord, queue, dedupe_key)
    LEFT JOIN LATERAL (
        SELECT x.id, x.state FROM queueworker.tasks_active x
        WHERE x.queue = k.queue AND x.dedupe_key = k.dedupe_key
        LIMIT 1
    ) a ON true
    LEFT JOIN LATERAL (
        SELECT y.id, y.state FROM queueworker.tasks_finished y
        WHERE a.id IS NULL AND y.queue = k.queue AND y.dedupe_key = k.dedupe_key
        ORDER BY y.finished_at DESC
        LIMIT 1
    ) f ON true
    WHERE coalesce(a.id, f.id) IS NOT NULL
    ORDER BY k.ord;
END
$$;

REVOKE EXECUTE ON FUNCTION queueworker.replace_pending(bigint[], jsonb[], integer[], timestamptz[]),
                           queueworker.existing_tasks(bigint[], text[], text[]) FROM PUBLIC;
