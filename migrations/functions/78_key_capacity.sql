-- queueworker functions: what a key-limited queue's keys let run, as the controller sees it
-- (docs/controller.md, docs/flow-control.md "What the controller does with it").
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE).

-- KEY_CAPACITY, read by QUEUE_DEPTH (worker/db/depth.sql) for each key-limited queue: how many of the
-- queue's tasks its keys let run at once (`key_slots`), the keys with tasks ready (`keys_ready`) and
-- how many of those are held (`keys_held`: paused, or behind a breaker still in its cooldown).
--
-- Per key (the tasks without a key are the key ''), its slots are its running tasks plus what it may
-- start: nothing while held; one probe once a breaker's cooldown is over; else its ready and running
-- tasks, up to its cap (`max_running`, its own or the queue's per-key default) and, under a rate, up
-- to the slots the rate keeps busy: rate x `task_seconds` (Little's law; the queue's mean task
-- duration, which QUEUE_DEPTH reads), at least one, and one while the duration is not known. Never
-- below its running tasks (a burst may run more than the rate keeps busy).
--
-- The ready tasks are sampled in fair order, as the claim reads them (`tasks_fair`, then the untagged
-- ones among the head of the queue's line: as many of its first tasks as the tagged ones left of the
-- sample, so that a sample the tagged tasks do not fill never reads the whole backlog to find
-- untagged ones), `sample` of them at most (up to 100,000): a round-robin over the keys, so a sample covers
-- the heads of many keys, not one key's backlog, and a key beyond the sample has none of its tasks in
-- it only when every key in it was served more rounds than that key could use. When the sample
-- filled and no key in it was bound by a limit, its keys may have more waiting than the sample shows:
-- `key_slots` is NULL (nothing known to bound). The cost: the sample, the queue's running tasks
-- (`tasks_running_keys`) and one probe of each primary key per key met; not the number of keys.
--
-- SECURITY DEFINER, so the controller reads counts without the grants to read keys: it returns no
-- key, no payload, only the three counts, as {"key_slots", "keys_ready", "keys_held"} (a scalar, so
-- QUEUE_DEPTH calls it only for key-limited queues, in a CASE). Granted to the controller
-- (docs/database-roles.sql), which may read every queue's depth; a queue that is not key-limited, or
-- unknown, gives NULL. Arguments out of bounds are refused in one line (22023).
CREATE OR REPLACE FUNCTION queueworker.key_capacity(queue_name text, sample integer, task_seconds float8)
    RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    size integer;
    capacity jsonb;
BEGIN
    IF queue_name IS NULL OR sample IS NULL OR sample < 1
       OR task_seconds IS NOT NULL AND NOT (task_seconds >= 0 AND task_seconds < 'Infinity'::float8) THEN
        RAISE EXCEPTION 'key_capacity: a queue name, a sample of at least 1 and a finite task duration of 0 '
                        'or more are needed' USING ERRCODE = '22023';
    END IF;
    size := least(sample, 100000);
    WITH settings AS MATERIALIZED (
        SELECT q.name, q.key_rate_per_second, q.key_max_running, q.key_breaker_failures,
               q.key_breaker_cooldown_seconds
        FROM queueworker.queues q WHERE q.name = queue_name AND q.key_limited
    ), tagged AS MATERIALIZED (
        SELECT coalesce(t.key, '') AS key
        FROM queueworker.tasks_active t
        WHERE t.state = 'pending' AND NOT t.delayed AND t.fair_tag IS NOT NULL AND t.queue = queue_name
          AND t.run_after <= now() AND EXISTS (SELECT FROM settings)
        ORDER BY t.priority DESC, t.fair_tag, t.id
        LIMIT size
    ), sampled AS MATERIALIZED (
        SELECT g.key FROM tagged g
        UNION ALL
        SELECT h.key FROM (
            SELECT coalesce(t.key, '') AS key, t.fair_tag
            FROM queueworker.tasks_active t
            WHERE t.state = 'pending' AND NOT t.delayed AND t.queue = queue_name
              AND t.run_after <= now() AND EXISTS (SELECT FROM settings)
            ORDER BY t.priority DESC, t.run_after, t.id
            LIMIT size - (SELECT count(*) FROM tagged)) AS h
        WHERE h.fair_tag IS NULL
    ), per_key AS (
        SELECT coalesce(r.key, u.key) AS key, coalesce(r.n, 0) AS ready, coalesce(u.n, 0) AS running
        FROM (SELECT s.key, count(*) AS n FROM sampled s GROUP BY s.key) AS r
        FULL JOIN (SELECT coalesce(t.key, '') AS key, count(*) AS n
                   FROM queueworker.tasks_active t
                   WHERE t.queue = queue_name AND t.state = 'running' AND t.fair_tag IS NOT NULL
                     AND EXISTS (SELECT FROM settings)
                   GROUP BY 1) AS u ON u.key = r.key
    ), limited AS (
        SELECT p.ready, p.running,
               coalesce(k.paused_until > now(), false)
               OR coalesce(s.key_breaker_failures IS NOT NULL AND b.breaker_state <> 'closed'
                           AND now() < b.breaker_changed_at + make_interval(secs => s.key_breaker_cooldown_seconds),
                           false) AS held,
               coalesce(s.key_breaker_failures IS NOT NULL AND b.breaker_state <> 'closed', false) AS probe,
               coalesce(k.max_running, s.key_max_running) AS cap,
               coalesce(k.rate_per_second, s.key_rate_per_second) AS rate
        FROM per_key p CROSS JOIN settings s
        LEFT JOIN LATERAL (SELECT * FROM queueworker.queue_keys k
                           WHERE k.queue = queue_name AND k.key = p.key LIMIT 1) AS k ON true
        LEFT JOIN LATERAL (SELECT * FROM queueworker.key_state b
                           WHERE b.queue = queue_name AND b.key = p.key LIMIT 1) AS b ON true
    ), slots AS (
        SELECT l.ready, l.held, l.ready + l.running AS wanted,
               CASE WHEN l.held THEN l.running
                    WHEN l.probe THEN l.running + least(l.ready, 1)
                    ELSE greatest(l.running, least(
                        l.ready + l.running, l.cap,
                        CASE WHEN l.rate IS NULL THEN NULL
                             WHEN task_seconds IS NULL THEN 1
                             ELSE greatest(1, ceil(least(l.rate * task_seconds, 1e9)))::bigint END))
               END AS n
        FROM limited l
    )
    SELECT jsonb_build_object(
               'key_slots', CASE WHEN (SELECT count(*) FROM sampled) >= size AND NOT bool_or(s.n < s.wanted) THEN NULL
                                 ELSE coalesce(sum(s.n), 0) END,
               'keys_ready', count(*) FILTER (WHERE s.ready > 0),
               'keys_held', count(*) FILTER (WHERE s.ready > 0 AND s.held))
    INTO capacity
    FROM slots s
    HAVING EXISTS (SELECT FROM settings);
    RETURN capacity;
END
$$;
REVOKE EXECUTE ON FUNCTION queueworker.key_capacity(text, integer, float8) FROM PUBLIC;
