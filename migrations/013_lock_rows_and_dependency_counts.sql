-- queueworker schema, version 13: locks no outside login can take, and dependencies settled by counts.
--
-- Advisory locks are open to every login: one without a single grant could hold the keys the
-- duties and the dependency settlement used and stall the queue. The duties now take a row of
-- `duty_locks` (FOR NO KEY UPDATE SKIP LOCKED), which only a role granted UPDATE on it can lock:
-- the worker (docs/database-roles.sql). The migrator locks `schema_migrations` itself
-- (worker/db/migrate.py); the settlement of dependencies takes no global lock at all.
--
-- Dependencies: each edge records what it counts for its dependent (`counted`: its prerequisite
-- is still to finish, or has ended so that the dependent may run, or has ended failed or
-- cancelled on a `cancel` edge; NULL until the commit of the transaction that added it), and each
-- dependent keeps the sums (`prerequisites_waiting`, `prerequisites_failed`). A prerequisite's end
-- or retry changes only its own edges and the counts of their dependents, so settling costs what
-- the edges touched cost, where it re-judged every prerequisite of every dependent before.
-- migrations/functions/40_dependencies.sql explains who settles an edge and why none is missed.
-- The counts are kept for dependents that are `blocked`, or `cancelled` by a prerequisite (error
-- type DependencyFailed): the only states a settlement moves a task out of. This migration counts
-- the edges of the graphs in flight from their prerequisites' states, as settled by version 12.

CREATE TABLE queueworker.duty_locks (
    duty text PRIMARY KEY
);
INSERT INTO queueworker.duty_locks (duty) VALUES ('rescue'), ('promote_due'), ('clean_finished');

-- Version 12's settlement: an advisory lock, a deferred trigger per edge, and a re-judgement of
-- every prerequisite. migrations/functions/40_dependencies.sql defines what replaces them (and
-- keeps settle_dependents(bigint[], bigint[]) for the workers of version 12 during an upgrade).
DROP TRIGGER IF EXISTS task_dependencies_settle ON queueworker.task_dependencies;
DROP FUNCTION IF EXISTS queueworker.settle_new_dependency();
DROP FUNCTION IF EXISTS queueworker.settle_cascade(bigint[], bigint[]);
DROP FUNCTION IF EXISTS queueworker.settle_tasks(bigint[], bigint[]);
DROP FUNCTION IF EXISTS queueworker.dependency_lock_key();

ALTER TABLE queueworker.task_dependencies
    ADD COLUMN counted text CONSTRAINT counted_as CHECK (counted IN ('waiting', 'done', 'failed'));
ALTER TABLE queueworker.tasks
    ADD COLUMN prerequisites_waiting integer NOT NULL DEFAULT 0,
    ADD COLUMN prerequisites_failed integer NOT NULL DEFAULT 0;
-- The prerequisite that cancelled a dependent (the smallest failed one) in one probe.
-- The edges of the dependents a transaction added, which its commit settles (NULL until then).
CREATE INDEX task_dependencies_uncounted ON queueworker.task_dependencies (task_id) WHERE counted IS NULL;
CREATE INDEX task_dependencies_failed ON queueworker.task_dependencies (task_id, prerequisite_id)
    WHERE counted = 'failed';

UPDATE queueworker.task_dependencies d
SET counted = CASE WHEN p.state IN ('blocked', 'pending', 'running', 'retrying') THEN 'waiting'
                   WHEN p.state IN ('failed', 'cancelled') AND d.cancel_on_failure THEN 'failed'
                   ELSE 'done' END
FROM queueworker.task_dependencies e
LEFT JOIN queueworker.tasks p ON p.id = e.prerequisite_id
WHERE e.prerequisite_id = d.prerequisite_id AND e.task_id = d.task_id;

-- Aimed at the partitions, so no trigger of the parent runs: no state changes here.
WITH counts AS (
    SELECT task_id, count(*) FILTER (WHERE counted = 'waiting') AS waiting,
           count(*) FILTER (WHERE counted = 'failed') AS failed
    FROM queueworker.task_dependencies GROUP BY task_id
)
UPDATE queueworker.tasks_active t
SET prerequisites_waiting = c.waiting, prerequisites_failed = c.failed
FROM counts c
WHERE t.id = c.task_id AND t.state = 'blocked';

WITH counts AS (
    SELECT task_id, count(*) FILTER (WHERE counted = 'waiting') AS waiting,
           count(*) FILTER (WHERE counted = 'failed') AS failed
    FROM queueworker.task_dependencies GROUP BY task_id
)
UPDATE queueworker.tasks_finished t
SET prerequisites_waiting = c.waiting, prerequisites_failed = c.failed
FROM counts c
WHERE t.id = c.task_id AND t.state = 'cancelled' AND t.error ->> 'type' = 'DependencyFailed';
