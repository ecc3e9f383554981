-- queueworker schema, version 19: producers insert tasks without reading any.
--
-- A producer's plain enqueue is an INSERT ... RETURNING id, queue, run_after (worker/db/enqueue.sql),
-- and RETURNING needs SELECT on the columns it returns: so far the producer held SELECT (id, queue,
-- run_after) on queueworker.tasks, which let it list every tenant's task ids, queues and due times.
-- Producers now insert through this view instead. It is automatically updatable (one table, plain
-- columns), so an INSERT into it is an INSERT into queueworker.tasks, run with the view owner's rights
-- on the table, firing the table's triggers (the audit row, the spec hash, the queue grants check) and
-- taking its defaults; RETURNING returns the rows just inserted. A SELECT reads nothing: the view
-- shows no row (WHERE false), so a producer granted INSERT and SELECT on it and nothing on the table
-- learns only the ids of the tasks it inserts. docs/database-roles.sql grants it and takes the table
-- back; docs/security.md has the model.
CREATE VIEW queueworker.new_tasks AS
    SELECT id, queue, task, payload, priority, run_after, delayed, max_attempts, timeout_seconds, headers, key,
           spec_hash
    FROM queueworker.tasks
    WHERE false;
