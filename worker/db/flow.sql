-- Flow control (migration 009): queue settings, the worker's view of them, circuit breakers.
-- Each statement is declared, with its parameter and row types, in queueworker/db/flow.py.
--
-- A queue's settings are returned as a QueueRow, with `paused_until` NULL for a pause until resumed
-- (stored as 'infinity', which Python cannot represent). The four changes of queueworker.client.operations
-- (pause_queue, resume_queue, limit_queue, breaker_queue) apply the change in a CTE `changed`, tell the
-- workers to re-read the queue's settings (channel queueworker_queues, payload: the queue), and, when
-- %(wake)s, wake them at %(wake_at)s: now when the change may let tasks through sooner, or when a timed
-- pause ends. The changes of one key's settings (set_key_limits, clear_key_limits, pause_key,
-- resume_key; migration 021) do the same, and return the key's settings as a KeyRow. A key's bucket
-- starts full again by emptying its columns of `queueworker.key_state` (NULL tokens: a full bucket),
-- not by deleting its row, which holds the key's breaker and health too (migration 022).

-- name: pause_queue
-- Paused until `until` ('infinity': until resumed). Running tasks finish; the workers wake when it ends.
WITH changed AS (
    INSERT INTO queueworker.queues AS q (name, paused_until) VALUES (%(queue)s, %(until)s)
    ON CONFLICT (name) DO UPDATE SET paused_until = EXCLUDED.paused_until, updated_at = now()
    RETURNING name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited,
       key_rate_per_second, key_burst, key_max_running, key_limited,
       key_breaker_failures, key_breaker_cooldown_seconds
), told AS (
    SELECT pg_notify('queueworker_queues', name) FROM changed
), woken AS (
    SELECT queueworker.wake_queue(name, coalesce(%(wake_at)s::timestamptz, now())) FROM changed
    WHERE %(wake)s
)
SELECT name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited,
       key_rate_per_second, key_burst, key_max_running, key_limited,
       key_breaker_failures, key_breaker_cooldown_seconds
FROM changed, (SELECT count(*) FROM told) AS t, (SELECT count(*) FROM woken) AS w;

-- name: resume_queue
-- No row: the queue has no settings, so it was not paused.
WITH changed AS (
    UPDATE queueworker.queues SET paused_until = NULL, updated_at = now()
    WHERE name = %(queue)s
    RETURNING name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited,
       key_rate_per_second, key_burst, key_max_running, key_limited,
       key_breaker_failures, key_breaker_cooldown_seconds
), told AS (
    SELECT pg_notify('queueworker_queues', name) FROM changed
), woken AS (
    SELECT queueworker.wake_queue(name, coalesce(%(wake_at)s::timestamptz, now())) FROM changed
    WHERE %(wake)s
)
SELECT name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited,
       key_rate_per_second, key_burst, key_max_running, key_limited,
       key_breaker_failures, key_breaker_cooldown_seconds
FROM changed, (SELECT count(*) FROM told) AS t, (SELECT count(*) FROM woken) AS w;

-- name: limit_queue
-- A rate limit (token bucket, full at first) and a global cap on running tasks, and the defaults of
-- every key of the queue (migration 021: a bucket and a cap per key); NULLs clear them. The buckets
-- of the keys without a rate of their own start full again when the default rate or burst changes
-- (`reset`). A per-key default makes the queue key-limited, and keyed
-- (migrations/functions/76_key_limits.sql).
WITH before AS (
    SELECT key_rate_per_second, key_burst FROM queueworker.queues WHERE name = %(queue)s
), changed AS (
    INSERT INTO queueworker.queues AS q (name, rate_per_second, burst, tokens, max_running,
                                         key_rate_per_second, key_burst, key_max_running)
    VALUES (%(queue)s, %(rate)s, %(burst)s, coalesce(%(burst)s, 0), %(max_running)s,
            %(key_rate)s, %(key_burst)s, %(key_max_running)s)
    ON CONFLICT (name) DO UPDATE
    SET rate_per_second = EXCLUDED.rate_per_second, burst = EXCLUDED.burst, max_running = EXCLUDED.max_running,
        tokens = CASE WHEN q.rate_per_second IS NOT DISTINCT FROM EXCLUDED.rate_per_second
                       AND q.burst IS NOT DISTINCT FROM EXCLUDED.burst THEN q.tokens ELSE EXCLUDED.tokens END,
        tokens_at = CASE WHEN q.rate_per_second IS NOT DISTINCT FROM EXCLUDED.rate_per_second
                          AND q.burst IS NOT DISTINCT FROM EXCLUDED.burst THEN q.tokens_at ELSE now() END,
        key_rate_per_second = EXCLUDED.key_rate_per_second, key_burst = EXCLUDED.key_burst,
        key_max_running = EXCLUDED.key_max_running,
        updated_at = now()
    RETURNING name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited,
       key_rate_per_second, key_burst, key_max_running, key_limited,
       key_breaker_failures, key_breaker_cooldown_seconds
), reset AS (
    UPDATE queueworker.key_state b SET tokens = NULL, tokens_at = NULL, next_token_at = NULL
    WHERE b.queue = %(queue)s AND b.tokens IS NOT NULL
      AND NOT EXISTS (SELECT FROM before f WHERE (f.key_rate_per_second, f.key_burst)
                                                 IS NOT DISTINCT FROM (%(key_rate)s::float8, %(key_burst)s::integer))
      AND NOT EXISTS (SELECT FROM queueworker.queue_keys k
                      WHERE k.queue = b.queue AND k.key = b.key AND k.rate_per_second IS NOT NULL)
), told AS (
    SELECT pg_notify('queueworker_queues', name) FROM changed
), woken AS (
    SELECT queueworker.wake_queue(name, coalesce(%(wake_at)s::timestamptz, now())) FROM changed
    WHERE %(wake)s
)
SELECT name, paused, paused_until, rate_per_second, burst, max_running, breaker_failures, breaker_cooldown_seconds,
       breaker_state, consecutive_failures, breaker_changed_at, limited, key_rate_per_second, key_burst,
       key_max_running, key_limited,
       key_breaker_failures, key_breaker_cooldown_seconds
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
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited,
       key_rate_per_second, key_burst, key_max_running, key_limited,
       key_breaker_failures, key_breaker_cooldown_seconds
), told AS (
    SELECT pg_notify('queueworker_queues', name) FROM changed
), woken AS (
    SELECT queueworker.wake_queue(name, coalesce(%(wake_at)s::timestamptz, now())) FROM changed
    WHERE %(wake)s
)
SELECT name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited,
       key_rate_per_second, key_burst, key_max_running, key_limited,
       key_breaker_failures, key_breaker_cooldown_seconds
FROM changed, (SELECT count(*) FROM told) AS t, (SELECT count(*) FROM woken) AS w;

-- name: key_breaker_queue
-- A circuit breaker for each key of the queue (`breaker Q --per-key`; NULLs remove it, migration 022):
-- it makes the queue key-limited. A new, changed or removed one starts every key's breaker closed
-- (each such change audited as `key_breaker_closed`, with the key); the keys' failure streaks are
-- their health and stay.
WITH changed AS (
    INSERT INTO queueworker.queues AS q (name, key_breaker_failures, key_breaker_cooldown_seconds)
    VALUES (%(queue)s, %(failures)s, %(cooldown)s)
    ON CONFLICT (name) DO UPDATE
    SET key_breaker_failures = EXCLUDED.key_breaker_failures,
        key_breaker_cooldown_seconds = EXCLUDED.key_breaker_cooldown_seconds, updated_at = now()
    RETURNING name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited,
       key_rate_per_second, key_burst, key_max_running, key_limited,
       key_breaker_failures, key_breaker_cooldown_seconds
), closed AS (
    UPDATE queueworker.key_state b SET breaker_state = 'closed', breaker_changed_at = NULL
    WHERE b.queue = %(queue)s AND b.breaker_state <> 'closed'
), told AS (
    SELECT pg_notify('queueworker_queues', name) FROM changed
), woken AS (
    SELECT queueworker.wake_queue(name, now()) FROM changed
)
SELECT name, paused, paused_until, rate_per_second, burst, max_running, breaker_failures, breaker_cooldown_seconds,
       breaker_state, consecutive_failures, breaker_changed_at, limited, key_rate_per_second, key_burst,
       key_max_running, key_limited, key_breaker_failures, key_breaker_cooldown_seconds
FROM changed, (SELECT count(*) FROM told) AS t, (SELECT count(*) FROM woken) AS w;

-- name: queue_settings
-- Every queue's settings, or one queue's: `queueworker status` and the console.
SELECT name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited,
       key_rate_per_second, key_burst, key_max_running, key_limited,
       key_breaker_failures, key_breaker_cooldown_seconds
FROM queueworker.queues
WHERE %(queue)s::text IS NULL OR name = %(queue)s ORDER BY name;

-- name: limited_queues
-- What a worker needs to choose its claim statement, for its own queues: those with flow control
-- (`limited`), the keyed ones (fair share, migration 020), the key-limited ones (migration 021),
-- and the fastest rate of a key (the default's, or a key's own): how soon a claim cut short by a
-- key's bucket is worth trying again; with a per-key breaker (migration 022), how many keys' breakers
-- are not closed (`key_state_breakers`); and when the first cooldown of a breaker that is not
-- closed ends (the queue's, or the earliest of its keys'), when a claim may take a probe: the worker
-- claims then, not at its next idle poll (up to `--poll-max-seconds` later); and whether a cap may
-- bind (the queue's, the keys' default, or some key's own settings, which may hold one): the worker
-- claims again once it has written outcomes of such a queue. Read on every refresh, not per claim.
SELECT name, rate_per_second, breaker_failures IS NOT NULL AS has_breaker, breaker_state, limited, keyed,
       key_limited, key_breaker_failures IS NOT NULL AS has_key_breaker,
       CASE WHEN key_breaker_failures IS NOT NULL
            THEN (SELECT count(*) FROM queueworker.key_state b
                  WHERE b.queue = q.name AND b.breaker_state <> 'closed')::integer END AS key_breakers_open,
       CASE WHEN key_limited THEN greatest(key_rate_per_second,
                                           (SELECT max(k.rate_per_second) FROM queueworker.queue_keys k
                                            WHERE k.queue = q.name)) END AS fastest_key_rate,
       least(CASE WHEN breaker_failures IS NOT NULL AND breaker_state <> 'closed'
                  THEN breaker_changed_at + make_interval(secs => breaker_cooldown_seconds) END,
             CASE WHEN key_breaker_failures IS NOT NULL
                  THEN (SELECT min(b.breaker_changed_at) FROM queueworker.key_state b
                        WHERE b.queue = q.name AND b.breaker_state <> 'closed')
                       + make_interval(secs => key_breaker_cooldown_seconds) END) AS probe_due_at,
       max_running IS NOT NULL OR key_max_running IS NOT NULL OR key_limits AS capped
FROM queueworker.queues q WHERE name = ANY(%(queues)s::text[]) AND (limited OR keyed);

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

-- name: record_key_outcomes
-- A worker's outcomes for the keys of a key-limited queue since its last report, one element per key
-- ('' for the tasks without a key): whether any succeeded, and how many failed after the last
-- success (or in all, when none did). Keeps each key's health (its failure streak, its last success
-- and failure) and moves its breaker when the queue has one (queueworker.key_breaker_next,
-- migrations/functions/77_key_breaker.sql). ON CONFLICT decides on the row as it is once locked,
-- so reports of one key by several workers at once add up. Returns each key's breaker state, and
-- whether this report changed it.
INSERT INTO queueworker.key_state AS b (queue, key, breaker_state, breaker_changed_at, failure_streak,
                                        last_success_at, last_failure_at)
SELECT %(queue)s, r.key, d.now_state, CASE WHEN d.now_state <> 'closed' THEN now() END, r.failures,
       CASE WHEN r.succeeded THEN now() END, CASE WHEN r.failures > 0 THEN now() END
FROM unnest(%(keys)s::text[], %(any_succeeded)s::boolean[], %(trailing_failures)s::integer[])
     AS r(key, succeeded, failures)
CROSS JOIN LATERAL (SELECT queueworker.key_breaker_next(%(queue)s, 'closed', 0, r.succeeded, r.failures)
                    AS now_state) AS d
ORDER BY r.key  -- the order CLAIM_KEYS charges them in: no deadlock between the two
ON CONFLICT (queue, key) DO UPDATE
SET failure_streak = CASE WHEN EXCLUDED.last_success_at IS NOT NULL THEN EXCLUDED.failure_streak
                          ELSE b.failure_streak + EXCLUDED.failure_streak END,
    breaker_state = queueworker.key_breaker_next(b.queue, b.breaker_state, b.failure_streak,
                                                 EXCLUDED.last_success_at IS NOT NULL, EXCLUDED.failure_streak),
    breaker_changed_at = CASE WHEN queueworker.key_breaker_next(b.queue, b.breaker_state, b.failure_streak,
                                                                EXCLUDED.last_success_at IS NOT NULL,
                                                                EXCLUDED.failure_streak) <> b.breaker_state
                              THEN now() ELSE b.breaker_changed_at END,
    last_success_at = coalesce(EXCLUDED.last_success_at, b.last_success_at),
    last_failure_at = coalesce(EXCLUDED.last_failure_at, b.last_failure_at)
RETURNING b.key, b.breaker_state AS now_state, coalesce(b.breaker_changed_at = now(), false) AS changed;

-- name: set_key_limits
-- A key's own settings (`limit Q --key K ...`): its weight in the queue's fair share (migration 020:
-- W claims per turn, for the tags given from now on), its rate and burst and its cap (migration 021;
-- NULL: the queue's per-key default), all at once, as `limit_queue` sets a queue's; a pause is kept.
-- Its bucket starts full again when its rate or burst changes (`reset`). The workers re-read the
-- queue's settings and wake: a key that was held may be let through.
WITH before AS (
    SELECT rate_per_second, burst FROM queueworker.queue_keys WHERE queue = %(queue)s AND key = %(key)s
), changed AS (
    INSERT INTO queueworker.queue_keys AS k (queue, key, weight, rate_per_second, burst, max_running)
    VALUES (%(queue)s, %(key)s, %(weight)s, %(rate)s, %(burst)s, %(max_running)s)
    ON CONFLICT (queue, key) DO UPDATE
    SET weight = EXCLUDED.weight, rate_per_second = EXCLUDED.rate_per_second, burst = EXCLUDED.burst,
        max_running = EXCLUDED.max_running, updated_at = now()
    RETURNING queue, key, weight, rate_per_second, burst, max_running,
              CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until,
              coalesce(paused_until > now(), false) AS paused
), reset AS (
    UPDATE queueworker.key_state b SET tokens = NULL, tokens_at = NULL, next_token_at = NULL
    WHERE b.queue = %(queue)s AND b.key = %(key)s AND b.tokens IS NOT NULL
      AND NOT EXISTS (SELECT FROM before f WHERE (f.rate_per_second, f.burst)
                                                 IS NOT DISTINCT FROM (%(rate)s::float8, %(burst)s::integer))
), told AS (
    SELECT pg_notify('queueworker_queues', queue) FROM changed
), woken AS (
    SELECT queueworker.wake_queue(queue, now()) FROM changed
)
SELECT queue, key, weight, rate_per_second, burst, max_running, paused_until, paused
FROM changed, (SELECT count(*) FROM told) AS t, (SELECT count(*) FROM woken) AS w;

-- name: clear_key_limits
-- `limit Q --key K --clear`: the key's weight is 1 again and the queue's per-key defaults apply to
-- it; a pause is kept. Its row goes when nothing else is left (`removed`), else loses those
-- settings (`kept`): the two match different rows. Returns the settings it had; no row: it had
-- none.
WITH before AS (
    SELECT queue, key, weight, rate_per_second, burst, max_running,
           CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until,
           coalesce(paused_until > now(), false) AS paused
    FROM queueworker.queue_keys WHERE queue = %(queue)s AND key = %(key)s
), removed AS (
    DELETE FROM queueworker.queue_keys
    WHERE queue = %(queue)s AND key = %(key)s AND paused_until IS NULL
    RETURNING queue
), kept AS (
    UPDATE queueworker.queue_keys
    SET weight = NULL, rate_per_second = NULL, burst = NULL, max_running = NULL, updated_at = now()
    WHERE queue = %(queue)s AND key = %(key)s AND paused_until IS NOT NULL
    RETURNING queue
), changed AS (
    SELECT queue FROM removed UNION ALL SELECT queue FROM kept
), reset AS (
    UPDATE queueworker.key_state b SET tokens = NULL, tokens_at = NULL, next_token_at = NULL
    WHERE b.queue = %(queue)s AND b.key = %(key)s AND b.tokens IS NOT NULL
), told AS (
    SELECT pg_notify('queueworker_queues', queue) FROM changed
), woken AS (
    SELECT queueworker.wake_queue(queue, now()) FROM changed
)
SELECT b.queue, b.key, b.weight, b.rate_per_second, b.burst, b.max_running, b.paused_until, b.paused
FROM before b, (SELECT count(*) FROM told) AS t, (SELECT count(*) FROM woken) AS w;

-- name: pause_key
-- `pause Q --key K [--for D]`: claims pass over the key's tasks until `until` ('infinity': until
-- resumed); its running tasks finish. Its other settings are kept. When a timed pause ends, the
-- workers wake (`woken`), and the first claim of the queue after it ends the pause for good
-- (queueworker.end_key_pauses).
WITH changed AS (
    INSERT INTO queueworker.queue_keys AS k (queue, key, paused_until) VALUES (%(queue)s, %(key)s, %(until)s)
    ON CONFLICT (queue, key) DO UPDATE SET paused_until = EXCLUDED.paused_until, updated_at = now()
    RETURNING queue, key, weight, rate_per_second, burst, max_running,
              CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until,
              coalesce(paused_until > now(), false) AS paused
), told AS (
    SELECT pg_notify('queueworker_queues', queue) FROM changed
), woken AS (
    SELECT queueworker.wake_queue(queue, %(wake_at)s::timestamptz) FROM changed WHERE %(wake_at)s::timestamptz IS NOT NULL
)
SELECT queue, key, weight, rate_per_second, burst, max_running, paused_until, paused
FROM changed, (SELECT count(*) FROM told) AS t, (SELECT count(*) FROM woken) AS w;

-- name: resume_key
-- `resume Q --key K`: ends the key's pause and wakes the queue's workers. The key's waiting tasks
-- take their place in line anew, behind the queue's current virtual time (the trigger of
-- migrations/functions/76_key_limits.sql). Its row goes when the pause was all it held. No row:
-- the key was not paused.
WITH removed AS (
    DELETE FROM queueworker.queue_keys
    WHERE queue = %(queue)s AND key = %(key)s AND paused_until IS NOT NULL
      AND num_nonnulls(weight, rate_per_second, max_running) = 0
    RETURNING queue, key
), kept AS (
    UPDATE queueworker.queue_keys SET paused_until = NULL, updated_at = now()
    WHERE queue = %(queue)s AND key = %(key)s AND paused_until IS NOT NULL
      AND num_nonnulls(weight, rate_per_second, max_running) > 0
    RETURNING queue, key, weight, rate_per_second, burst, max_running
), told AS (
    SELECT pg_notify('queueworker_queues', queue) FROM (SELECT queue FROM removed UNION ALL SELECT queue FROM kept) c
), woken AS (
    SELECT queueworker.wake_queue(queue, now())
    FROM (SELECT queue FROM removed UNION ALL SELECT queue FROM kept) AS c
)
SELECT queue, key, NULL::float8 AS weight, NULL::float8 AS rate_per_second, NULL::integer AS burst,
       NULL::integer AS max_running, NULL::timestamptz AS paused_until, false AS paused
FROM removed, (SELECT count(*) FROM told) AS t, (SELECT count(*) FROM woken) AS w
UNION ALL
SELECT queue, key, weight, rate_per_second, burst, max_running, NULL, false FROM kept;

-- name: key_settings
-- The keys of a queue with settings of their own (`queueworker status --queue Q`), at most `limit`.
SELECT queue, key, weight, rate_per_second, burst, max_running,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until,
       coalesce(paused_until > now(), false) AS paused
FROM queueworker.queue_keys WHERE queue = %(queue)s ORDER BY key LIMIT %(limit)s;
