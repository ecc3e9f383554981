-- Flow control (migration 009): queue settings, the worker's view of them, circuit breakers.
-- Each statement is declared, with its parameter and row types, in queueworker/db/flow.py.
--
-- A queue's settings are returned as a QueueRow, with `paused_until` NULL for a pause until resumed
-- (stored as 'infinity', which Python cannot represent). The four changes of queueworker.client.operations
-- (pause_queue, resume_queue, limit_queue, breaker_queue) apply the change in a CTE `changed`, tell the
-- workers to re-read the queue's settings (channel queueworker_queues, payload: the queue), and, when
-- %(wake)s, wake them at %(wake_at)s: now when the change may let tasks through sooner, or when a timed
-- pause ends.

-- name: pause_queue
-- Paused until `until` ('infinity': until resumed). Running tasks finish; the workers wake when it ends.
WITH changed AS (
    INSERT INTO queueworker.queues AS q (name, paused_until) VALUES (%(queue)s, %(until)s)
    ON CONFLICT (name) DO UPDATE SET paused_until = EXCLUDED.paused_until, updated_at = now()
    RETURNING name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited
), told AS (
    SELECT pg_notify('queueworker_queues', name) FROM changed
), woken AS (
    SELECT queueworker.wake_queue(name, coalesce(%(wake_at)s::timestamptz, now())) FROM changed
    WHERE %(wake)s
)
SELECT name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited
FROM changed, (SELECT count(*) FROM told) AS t, (SELECT count(*) FROM woken) AS w;

-- name: resume_queue
-- No row: the queue has no settings, so it was not paused.
WITH changed AS (
    UPDATE queueworker.queues SET paused_until = NULL, updated_at = now()
    WHERE name = %(queue)s
    RETURNING name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited
), told AS (
    SELECT pg_notify('queueworker_queues', name) FROM changed
), woken AS (
    SELECT queueworker.wake_queue(name, coalesce(%(wake_at)s::timestamptz, now())) FROM changed
    WHERE %(wake)s
)
SELECT name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited
FROM changed, (SELECT count(*) FROM told) AS t, (SELECT count(*) FROM woken) AS w;

-- name: limit_queue
-- A rate limit (token bucket, full at first) and a global cap on running tasks; NULLs clear them.
WITH changed AS (
    INSERT INTO queueworker.queues AS q (name, rate_per_second, burst, tokens, max_running)
    VALUES (%(queue)s, %(rate)s, %(burst)s, coalesce(%(burst)s, 0), %(max_running)s)
    ON CONFLICT (name) DO UPDATE
    SET rate_per_second = EXCLUDED.rate_per_second, burst = EXCLUDED.burst, max_running = EXCLUDED.max_running,
        tokens = CASE WHEN q.rate_per_second IS NOT DISTINCT FROM EXCLUDED.rate_per_second
                       AND q.burst IS NOT DISTINCT FROM EXCLUDED.burst THEN q.tokens ELSE EXCLUDED.tokens END,
        tokens_at = CASE WHEN q.rate_per_second IS NOT DISTINCT FROM EXCLUDED.rate_per_second
                          AND q.burst IS NOT DISTINCT FROM EXCLUDED.burst THEN q.tokens_at ELSE now() END,
        updated_at = now()
    RETURNING name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited
), told AS (
    SELECT pg_notify('queueworker_queues', name) FROM changed
), woken AS (
    SELECT queueworker.wake_queue(name, coalesce(%(wake_at)s::timestamptz, now())) FROM changed
    WHERE %(wake)s
)
SELECT name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited
FROM changed, (SELECT count(*) FROM told) AS t, (SELECT count(*) FROM woken) AS w;

-- name: breaker_queue
-- A circuit breaker (NULLs remove it); a new or changed one starts closed.
WITH changed AS (
    INSERT INTO queueworker.queues AS q (name, breaker_failures, breaker_cooldown_seconds)
    VALUES (%(queue)s, %(failures)s, %(cooldown)s)
    ON CONFLICT (name) DO UPDATE
    SET breaker_failures = EXCLUDED.breaker_failures, breaker_cooldown_seconds = EXCLUDED.breaker_cooldown_seconds,
        breaker_state = 'closed', consecutive_failures = 0, breaker_changed_at = NULL, updated_at = now()
    RETURNING name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited
), told AS (
    SELECT pg_notify('queueworker_queues', name) FROM changed
), woken AS (
    SELECT queueworker.wake_queue(name, coalesce(%(wake_at)s::timestamptz, now())) FROM changed
    WHERE %(wake)s
)
SELECT name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited
FROM changed, (SELECT count(*) FROM told) AS t, (SELECT count(*) FROM woken) AS w;

-- name: queue_settings
-- Every queue's settings, or one queue's: `queueworker status` and the console.
SELECT name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited
FROM queueworker.queues
WHERE %(queue)s::text IS NULL OR name = %(queue)s ORDER BY name;

-- name: limited_queues
-- What a worker needs to choose its claim statement, for its own queues: those with flow control
-- (`limited`) and the keyed ones (fair share, migration 020).
SELECT name, rate_per_second, breaker_failures IS NOT NULL AS has_breaker, breaker_state, limited, keyed
FROM queueworker.queues WHERE name = ANY(%(queues)s::text[]) AND (limited OR keyed);

-- name: record_breaker
-- A worker's outcomes for a queue with a breaker, since its last report: whether any succeeded,
-- and how many failed after the last success (or in all, when none did). The breaker opens at
-- `breaker_failures` consecutive failures; a half-open breaker closes on a success and opens
-- again on a failure. Returns the state before and after.
WITH before AS (
    SELECT name, breaker_state, breaker_failures,
           CASE WHEN %(any_succeeded)s THEN %(trailing_failures)s
                ELSE consecutive_failures + %(trailing_failures)s END AS streak
    FROM queueworker.queues WHERE name = %(queue)s AND breaker_failures IS NOT NULL
    FOR NO KEY UPDATE
), decided AS (
    SELECT name, breaker_state AS was, streak,
           CASE WHEN breaker_state = 'half_open' AND streak > 0 THEN 'open'
                WHEN breaker_state = 'half_open' AND %(any_succeeded)s THEN 'closed'
                WHEN breaker_state = 'closed' AND streak >= breaker_failures THEN 'open'
                ELSE breaker_state END AS now_state
    FROM before
)
UPDATE queueworker.queues q
SET consecutive_failures = d.streak, breaker_state = d.now_state,
    breaker_changed_at = CASE WHEN d.now_state <> d.was THEN now() ELSE q.breaker_changed_at END
FROM decided d WHERE q.name = d.name
RETURNING d.was, d.now_state;

-- name: set_key_weight
-- A key's weight in its queue's fair share (migration 020): W claims per turn. It applies to the
-- tags given from now on (tasks of the key already in line keep theirs). Nothing to tell the
-- workers: the triggers that give tags read it.
INSERT INTO queueworker.queue_keys AS k (queue, key, weight) VALUES (%(queue)s, %(key)s, %(weight)s)
ON CONFLICT (queue, key) DO UPDATE SET weight = EXCLUDED.weight, updated_at = now()
RETURNING queue, key, weight;

-- name: clear_key_weight
-- `limit Q --key K --clear`: the key's weight is 1 again. No row: it had none.
DELETE FROM queueworker.queue_keys WHERE queue = %(queue)s AND key = %(key)s
RETURNING queue, key, weight;
