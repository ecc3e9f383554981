-- queueworker schema, version 16: queue grants, and the acting login on every audit row.
--
-- A database often serves several applications, each a producer login. Until now every producer
-- could enqueue into, read and replace tasks of every queue, add partitions to another's run and
-- advance another's watermark. A queue grant (`queueworker grant ROLE --queue PATTERN`) gives a
-- role, and every login that is a member of it, the queues whose names match a glob. Until the
-- first grant is made every producer may use every queue (an installation with one application
-- needs no set-up); once one exists, a producer login may use only the queues its grants match.
-- The functions that read and check grants are in migrations/functions/15_queue_grants.sql; the
-- row-level security that limits a producer's reads and plain inserts is set by
-- docs/database-roles.sql, which creates the roles it names. docs/security.md has the model.
CREATE TABLE queueworker.queue_grants (
    grantee    text NOT NULL CHECK (length(grantee) BETWEEN 1 AND 63),
    -- A glob over queue names: the characters of a queue name, `*` for any run of them, `?` for one.
    pattern    text NOT NULL CHECK (pattern ~ '^[A-Za-z0-9_.:*?-]{1,128}$'),
    granted_by text NOT NULL DEFAULT session_user,
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (grantee, pattern)
);

-- Who did it: the login (`session_user`) that caused each transition, as run_events and queue_events
-- have recorded since they exist. Added without a default and then given one, so the existing rows are
-- not rewritten (theirs stays NULL: not recorded).
ALTER TABLE queueworker.task_events ADD COLUMN by_user text;
ALTER TABLE queueworker.task_events ALTER COLUMN by_user SET DEFAULT session_user;

-- A run belongs to the queues of its tasks (partitions, consolidation and alert), and a watermark to
-- the queues of the run that last advanced it: only a login that may use all of them may add to the
-- run or start a run that moves the watermark. Existing runs take the queues of the tasks they still
-- have and of their consolidation and alert specs; existing watermarks those of their last run.
ALTER TABLE queueworker.runs ADD COLUMN queues text[];
ALTER TABLE queueworker.watermarks ADD COLUMN queues text[];
-- start_run looks up the last run of a watermark that has not advanced yet.
CREATE INDEX runs_watermark ON queueworker.runs (watermark, id DESC) WHERE watermark IS NOT NULL;

UPDATE queueworker.runs r
SET queues = (SELECT array_agg(DISTINCT q.queue ORDER BY q.queue) FROM (
                  SELECT t.queue FROM queueworker.tasks t WHERE t.run_id = r.id
                  UNION ALL SELECT coalesce(r.on_success ->> 'queue', 'default') WHERE r.on_success IS NOT NULL
                  UNION ALL SELECT coalesce(r.on_failure ->> 'queue', 'default') WHERE r.on_failure IS NOT NULL) AS q);
UPDATE queueworker.watermarks w SET queues = r.queues FROM queueworker.runs r WHERE r.id = w.run_id;
