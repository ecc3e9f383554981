-- queueworker schema, version 4: unique tasks.
--
-- * `spec_hash`: SHA-256 of the canonical JSON of (queue, task, payload), computed by the database
--   for every row however it was inserted, so producers in any language agree. "Canonical" is
--   jsonb's own text form: keys sorted and duplicates removed, whitespace normalised;
--   `queueworker.spec_hash(queue, task, payload)` computes it for a lookup. Row triggers fill it
--   when a task is inserted without one and when an unfinished task's queue, task or payload
--   change; a row moving between partitions keeps its value. (A bulk load with triggers disabled
--   must set it itself.) Not a stored generated column: Postgres recomputes
--   those on every UPDATE (each claim and heartbeat) and on the move to `tasks_finished`, which
--   cost the hot path about a sixth of its throughput.
-- * `dedupe_key`: at most one unfinished task per (queue, dedupe_key). Every unfinished state lives
--   in the `tasks_active` partition, so a unique index there says exactly that; a task that
--   finishes moves to `tasks_finished` and frees its key.
-- * A pending task's payload, priority or schedule changed in place (a producer's
--   `on_conflict="replace"`, or an operator's UPDATE) now leaves an audit row: `pending -> pending`
--   with `{"replaced": [...the columns...]}`.
-- * `enqueue_unique` and `replace_pending`: what a producer may do with unique tasks, as definer
--   functions, so the producer role needs no right on the `tasks_active` partition (whose unique
--   index the ON CONFLICT needs) nor a general UPDATE on tasks. Inserts aimed at `tasks_active`
--   are audited by a trigger of its own: DML aimed at a partition does not fire the parent's
--   statement triggers.
--
-- Filling `spec_hash` for the existing rows rewrites them: on a big history, run `queueworker migrate`
-- in a quiet moment (or lower the retention first).

CREATE FUNCTION queueworker.spec_hash(queue text, task text, payload jsonb) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.sha256(pg_catalog.convert_to(pg_catalog.jsonb_build_array(queue, task, payload)::text, 'UTF8'))
$$;

ALTER TABLE queueworker.tasks
    ADD COLUMN spec_hash bytea,
    ADD COLUMN dedupe_key text CONSTRAINT dedupe_key_length CHECK (length(dedupe_key) BETWEEN 1 AND 512);

CREATE FUNCTION queueworker.fill_spec_hash() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.spec_hash := queueworker.spec_hash(NEW.queue, NEW.task, NEW.payload);
    RETURN NEW;
END
$$;

-- Row triggers of a partition fire for inserts routed through the parent too. A row that brings its
-- hash along (a completion or a retry moving it between partitions) is not even passed to the
-- function: the WHEN condition is checked first, without a call.
CREATE TRIGGER tasks_active_spec_hash BEFORE INSERT ON queueworker.tasks_active
    FOR EACH ROW WHEN (NEW.spec_hash IS NULL) EXECUTE FUNCTION queueworker.fill_spec_hash();
CREATE TRIGGER tasks_finished_spec_hash BEFORE INSERT ON queueworker.tasks_finished
    FOR EACH ROW WHEN (NEW.spec_hash IS NULL) EXECUTE FUNCTION queueworker.fill_spec_hash();
-- Claims and heartbeats set none of these columns, so they never fire it.
CREATE TRIGGER tasks_active_spec_changed BEFORE UPDATE OF queue, task, payload ON queueworker.tasks_active
    FOR EACH ROW EXECUTE FUNCTION queueworker.fill_spec_hash();

-- Aimed at the partitions, so the parent's audit trigger does not collect the whole history.
UPDATE queueworker.tasks_active SET spec_hash = queueworker.spec_hash(queue, task, payload);
UPDATE queueworker.tasks_finished SET spec_hash = queueworker.spec_hash(queue, task, payload);
ALTER TABLE queueworker.tasks ALTER COLUMN spec_hash SET NOT NULL;

-- Replay checks by spec over the finished history. Not on `tasks_active`: a claim moves its row to a
-- new version outside HOT, which would insert a random key into that index for every attempt (a
-- tenth of the hot path's throughput); live work is small, and `dedupe="spec"` finds an unfinished
-- duplicate through `tasks_dedupe`.
CREATE INDEX tasks_spec_hash ON queueworker.tasks_finished (spec_hash);
-- The arbiter of the producer's `INSERT ... ON CONFLICT`: one unfinished task per key and queue.
CREATE UNIQUE INDEX tasks_dedupe ON queueworker.tasks_active (queue, dedupe_key) WHERE dedupe_key IS NOT NULL;

-- The columns whose in-place change on a pending task is a replacement (audited).
CREATE FUNCTION queueworker.replaced_columns(new_row queueworker.tasks, old_row queueworker.tasks)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT pg_catalog.jsonb_agg(name ORDER BY name) FROM (VALUES
        ('payload', new_row.payload IS DISTINCT FROM old_row.payload),
        ('priority', new_row.priority IS DISTINCT FROM old_row.priority),
        ('run_after', new_row.run_after IS DISTINCT FROM old_row.run_after)) AS c(name, changed)
    WHERE changed
$$;

CREATE OR REPLACE FUNCTION queueworker.audit_task_updates() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT n.id, o.state, n.state, coalesce(o.lease_owner, n.lease_owner), n.lease_token,
           CASE WHEN n.state IS DISTINCT FROM o.state
                THEN queueworker.transition_detail(n.attempts, n.error, o.error)
                ELSE jsonb_build_object('replaced', queueworker.replaced_columns(n, o)) END
    FROM new_rows n
    JOIN old_rows o ON o.id = n.id
    WHERE n.state IS DISTINCT FROM o.state
       OR (n.state = 'pending' AND queueworker.replaced_columns(n, o) IS NOT NULL);
    RETURN NULL;
END
$$;

CREATE TRIGGER tasks_active_audit_insert AFTER INSERT ON queueworker.tasks_active
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.audit_task_inserts();

-- Wakes a queue's listeners for the rows of one group (as sql.ENQUEUE does): at once when one is due
-- now, else with the earliest due time, so listeners can schedule a precise wake-up.
CREATE FUNCTION queueworker.wake_queue(queue text, earliest timestamptz) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.pg_notify('queueworker', CASE WHEN earliest <= now() THEN queue
                                                    ELSE queue || ' ' || extract(epoch FROM earliest)::text END)
$$;

-- Inserts the specs whose (queue, key) no unfinished task holds; one row per spec, in order, with
-- its key (the hex spec hash for `by_spec`) and its new id, or NULL where a task held the key.
-- Called by sql.ENQUEUE_UNIQUE.
CREATE FUNCTION queueworker.enqueue_unique(queues text[], tasks text[], payloads jsonb[], priorities integer[],
                                           run_afters timestamptz[], max_attempts integer[], timeouts integer[],
                                           dedupe_keys text[], by_spec boolean[])
RETURNS TABLE (ord bigint, queue text, dedupe_key text, id bigint, notified bigint)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH specs AS MATERIALIZED (
        SELECT s.ord, s.queue, s.task, s.payload, s.priority, s.run_after, s.max_attempts, s.timeout_seconds,
               CASE WHEN s.by_spec THEN encode(queueworker.spec_hash(s.queue, s.task, s.payload), 'hex')
                    ELSE s.dedupe_key END AS dedupe_key
        FROM unnest(queues, tasks, payloads, priorities, run_afters, max_attempts, timeouts, dedupe_keys, by_spec)
             WITH ORDINALITY AS s(queue, task, payload, priority, run_after, max_attempts, timeout_seconds,
                                  dedupe_key, by_spec, ord)
    ), inserted AS (
        INSERT INTO queueworker.tasks_active
            (id, queue, task, payload, priority, run_after, delayed, max_attempts, timeout_seconds, dedupe_key)
        OVERRIDING SYSTEM VALUE  -- the identity is the parent's: an insert aimed at a partition takes ids itself
        SELECT nextval('queueworker.tasks_id_seq'), queue, task, payload, priority, coalesce(run_after, now()),
               coalesce(run_after > now(), false), max_attempts, timeout_seconds, dedupe_key
        FROM specs ORDER BY ord
        ON CONFLICT (queue, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING id, queue, dedupe_key, run_after
    ), notified AS (
        SELECT queueworker.wake_queue(queue, min(run_after)) FROM inserted GROUP BY queue
    )
    SELECT s.ord, s.queue, s.dedupe_key, i.id, (SELECT count(*) FROM notified)
    FROM specs s LEFT JOIN inserted i ON i.queue = s.queue AND i.dedupe_key = s.dedupe_key
    ORDER BY s.ord
$$;

-- Gives pending tasks that have a dedupe key new values (the last of an id's entries wins), where
-- they change anything; returns the ids changed. Called by sql.ENQUEUE_REPLACE.
CREATE FUNCTION queueworker.replace_pending(ids bigint[], payloads jsonb[], priorities integer[],
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
          AND (t.payload IS DISTINCT FROM r.payload OR t.priority IS DISTINCT FROM r.priority
               OR t.run_after IS DISTINCT FROM coalesce(r.run_after, least(t.run_after, now())))
        RETURNING t.id, t.queue, t.run_after
    ), notified AS (
        SELECT queueworker.wake_queue(queue, min(run_after)) FROM replaced GROUP BY queue
    )
    SELECT id, (SELECT count(*) FROM notified) FROM replaced ORDER BY id
$$;

REVOKE EXECUTE ON FUNCTION queueworker.enqueue_unique(text[], text[], jsonb[], integer[], timestamptz[], integer[],
                                                      integer[], text[], boolean[]),
                           queueworker.replace_pending(bigint[], jsonb[], integer[], timestamptz[])
    FROM PUBLIC;

ANALYZE queueworker.tasks;
