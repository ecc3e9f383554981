-- The keys of a queue (migration 018; docs/flow-control.md): what `queueworker keys` and the console
-- show. Each statement is declared, with its parameter and row types, in queueworker/db/keys.py.

-- name: key_report
-- Per key of a queue: its tasks ready to run, due later (delayed or retrying), blocked on
-- prerequisites and running, since when its oldest ready task has been due; its weight in the
-- queue's fair share (NULL: the default of 1); the limits that hold for it (its own, else the
-- queue's per-key defaults: migration 021), whether it is paused and until when (NULL: until
-- resumed), and the whole tokens its bucket holds now (a key whose bucket was never charged has a
-- full one); its breaker's state when the queue has a breaker per key (NULL otherwise) and its
-- health (migration 022: failures since its last success, its last success and last failure, as the
-- workers reported them; zero and NULL for a key no report reached). The tasks without a key are one row (key NULL; their bucket is the key '' of
-- key_state); a key with a setting but no task is a row too, and so is a key whose breaker is not
-- closed (`key_state_breakers`: a source that failed until its breaker opened, and has no task
-- left, is what an operator looks for). The keys with the most tasks ready
-- come first, at most %(limit)s of them; every row also carries the totals over all keys, so a
-- report cut to its first rows still says how many keys and tasks there are. Through
-- queueworker.tasks, for the operator's grants: the state list prunes it to tasks_active, which it
-- reads once (the cost grows with the queue's unfinished tasks, not with its history); the settings
-- and buckets are read for the listed keys only.
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
    SELECT coalesce(p.key, nullif(s.key, '')) AS key, coalesce(p.ready, 0) AS ready, coalesce(p.later, 0) AS later,
           coalesce(p.blocked, 0) AS blocked, coalesce(p.running, 0) AS running, p.ready_since
    FROM per_key p
    FULL JOIN (SELECT key FROM queueworker.queue_keys WHERE queue = %(queue)s
               UNION
               SELECT key FROM queueworker.key_state WHERE queue = %(queue)s AND breaker_state <> 'closed') s
        ON s.key = coalesce(p.key, '')
), listed AS (
    SELECT k.*, count(*) OVER () AS keys_total, sum(k.ready) OVER ()::bigint AS ready_total,
           sum(k.running) OVER ()::bigint AS running_total
    FROM keys k
    ORDER BY k.ready DESC, k.running DESC, k.key NULLS FIRST
    LIMIT %(limit)s
), limits AS (
    SELECT l.*, o.weight, coalesce(o.max_running, q.key_max_running) AS max_running,
           CASE WHEN o.rate_per_second IS NOT NULL THEN o.rate_per_second ELSE q.key_rate_per_second END
               AS rate_per_second,
           CASE WHEN o.rate_per_second IS NOT NULL THEN o.burst ELSE q.key_burst END AS burst,
           coalesce(o.paused_until > now(), false) AS paused,
           CASE WHEN o.paused_until > now() AND isfinite(o.paused_until) THEN o.paused_until END AS paused_until,
           q.key_breaker_failures IS NOT NULL AS has_breaker
    FROM listed l
    LEFT JOIN queueworker.queue_keys o ON o.queue = %(queue)s AND o.key = l.key
    LEFT JOIN queueworker.queues q ON q.name = %(queue)s
)
SELECT m.key, m.ready, m.later, m.blocked, m.running, m.ready_since, m.weight, m.max_running, m.rate_per_second,
       m.burst, m.paused, m.paused_until,
       CASE WHEN m.rate_per_second IS NOT NULL THEN floor(coalesce(
           least(m.burst, b.tokens + m.rate_per_second * extract(epoch FROM now() - b.tokens_at)), m.burst))::integer
       END AS tokens,
       CASE WHEN m.has_breaker THEN coalesce(b.breaker_state, 'closed') END AS breaker_state,
       coalesce(b.failure_streak, 0) AS failure_streak, b.last_success_at, b.last_failure_at,
       m.keys_total, m.ready_total, m.running_total
FROM limits m
LEFT JOIN queueworker.key_state b ON b.queue = %(queue)s AND b.key = coalesce(m.key, '')
ORDER BY m.ready DESC, m.running DESC, m.key NULLS FIRST;
