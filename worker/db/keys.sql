-- The keys of a queue (migration 018; docs/flow-control.md): what `queueworker keys` and the console
-- show. Each statement is declared, with its parameter and row types, in queueworker/db/keys.py.

-- name: key_report
-- Per key of a queue: its tasks ready to run, due later (delayed or retrying), blocked on
-- prerequisites and running, since when its oldest ready task has been due, and its weight in the
-- queue's fair share (NULL: the default of 1). The tasks without a key are one row (key NULL); a key
-- with a setting but no task is a row too. The keys with the most tasks ready come first, at most
-- %(limit)s of them; every row also carries the totals over all keys, so a report cut to its
-- first rows still says how many keys and tasks there are. Through queueworker.tasks, for the
-- operator's grants: the state list prunes it to tasks_active, which it reads once (the cost grows
-- with the queue's unfinished tasks, not with its history).
WITH per_key AS (
    SELECT key,
           count(*) FILTER (WHERE state = 'pending' AND NOT delayed) AS ready,
           count(*) FILTER (WHERE (state = 'pending' AND delayed) OR state = 'retrying') AS later,
           count(*) FILTER (WHERE state = 'blocked') AS blocked,
           count(*) FILTER (WHERE state = 'running') AS running,
           min(run_after) FILTER (WHERE state = 'pending' AND NOT delayed) AS ready_since
    FROM queueworker.tasks
    WHERE queue = %(queue)s AND state IN ('pending', 'running', 'retrying', 'blocked')
    GROUP BY key
), keys AS (
    SELECT coalesce(p.key, s.key) AS key, coalesce(p.ready, 0) AS ready, coalesce(p.later, 0) AS later,
           coalesce(p.blocked, 0) AS blocked, coalesce(p.running, 0) AS running, p.ready_since, s.weight
    FROM per_key p
    FULL JOIN (SELECT key, weight FROM queueworker.queue_keys WHERE queue = %(queue)s) s ON s.key = p.key
)
SELECT key, ready, later, blocked, running, ready_since, weight,
       count(*) OVER () AS keys_total, sum(ready) OVER ()::bigint AS ready_total,
       sum(running) OVER ()::bigint AS running_total
FROM keys
ORDER BY ready DESC, running DESC, key NULLS FIRST
LIMIT %(limit)s;
