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
--   cost the hot path about a sixth of its throughput. The function and the triggers are in
--   migrations/functions/30_unique_tasks.sql.
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
--   statement triggers. (Today: enqueue_tasks in migrations/functions/60_enqueue.sql, which replaced
--   enqueue_unique in version 6, replace_pending in 30_unique_tasks.sql, the audit of replacements
--   and of inserts aimed at `tasks_active` in 10_audit.sql.)
--
-- Filling `spec_hash` for the existing rows rewrites them: on a big history, run `queueworker migrate`
-- in a quiet moment (or lower the retention first).

ALTER TABLE queueworker.tasks
    ADD COLUMN spec_hash bytea,
    ADD COLUMN dedupe_key text CONSTRAINT dedupe_key_length CHECK (length(dedupe_key) BETWEEN 1 AND 512);

-- Aimed at the partitions, so the parent's audit trigger does not collect the whole history. The
-- expression is `queueworker.spec_hash(queue, task, payload)` as it was at version 4, written out:
-- a versioned migration calls no queueworker function (those are defined after it, in
-- migrations/functions/, and may change later; the hash of these rows must not).
UPDATE queueworker.tasks_active SET spec_hash =
    pg_catalog.sha256(pg_catalog.convert_to(pg_catalog.jsonb_build_array(queue, task, payload)::text, 'UTF8'));
UPDATE queueworker.tasks_finished SET spec_hash =
    pg_catalog.sha256(pg_catalog.convert_to(pg_catalog.jsonb_build_array(queue, task, payload)::text, 'UTF8'));
ALTER TABLE queueworker.tasks ALTER COLUMN spec_hash SET NOT NULL;

-- Replay checks by spec over the finished history. Not on `tasks_active`: a claim moves its row to a
-- new version outside HOT, which would insert a random key into that index for every attempt (a
-- tenth of the hot path's throughput); live work is small, and `dedupe="spec"` finds an unfinished
-- duplicate through `tasks_dedupe`.
CREATE INDEX tasks_spec_hash ON queueworker.tasks_finished (spec_hash);
-- The arbiter of the producer's `INSERT ... ON CONFLICT`: one unfinished task per key and queue.
CREATE UNIQUE INDEX tasks_dedupe ON queueworker.tasks_active (queue, dedupe_key) WHERE dedupe_key IS NOT NULL;

ANALYZE queueworker.tasks;
