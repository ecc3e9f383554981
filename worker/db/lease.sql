-- The lease loop of a worker (queueworker.runtime): claim, heartbeat, checkpoint, complete, hand
-- back, release. Every write of an attempt is fenced: it matches (id, lease_token, state = 'running'),
-- so a worker that lost its lease (expired, rescued, re-claimed, cancelled) changes nothing; only
-- `release` matches the worker instead (it runs once the worker's outcomes are all written).
-- Each statement is declared, with its parameter and row types, in queueworker.db.lease.

-- name: claim
-- Leases up to `limit` pending tasks of a queue without flow control or keys, highest priority first,
-- then earliest due, then oldest: queueworker.claim_tasks (migrations/functions/35_claims.sql says how,
-- and why a function), committed durably.
SELECT id, queue, task, payload_json, attempts, max_attempts, lease_token, seconds_to_deadline, run_json,
       checkpoint_json, headers_json, key
FROM queueworker.claim_tasks(%(queue)s::text, %(limit)s::integer, %(worker)s::uuid, %(lease_seconds)s::float8,
                                %(timeout_seconds)s::float8, false);

-- name: claim_async_commit
-- `claim`, committed without waiting for the disk (--async-claim-commit, the default:
-- docs/failure-handling.md, "Claims do not wait for the disk").
SELECT id, queue, task, payload_json, attempts, max_attempts, lease_token, seconds_to_deadline, run_json,
       checkpoint_json, headers_json, key
FROM queueworker.claim_tasks(%(queue)s::text, %(limit)s::integer, %(worker)s::uuid, %(lease_seconds)s::float8,
                                %(timeout_seconds)s::float8, true);

-- name: claim_fair
-- The claim of a keyed queue without flow control (migration 020, docs/flow-control.md), in fair-share
-- order: queueworker.claim_fair_tasks (migrations/functions/35_claims.sql), committed durably.
SELECT id, queue, task, payload_json, attempts, max_attempts, lease_token, seconds_to_deadline, run_json,
       checkpoint_json, headers_json, key
FROM queueworker.claim_fair_tasks(%(queue)s::text, %(limit)s::integer, %(worker)s::uuid, %(lease_seconds)s::float8,
                                     %(timeout_seconds)s::float8, false);

-- name: claim_fair_async_commit
-- `claim_fair`, committed without waiting for the disk (--async-claim-commit), as `claim_async_commit`.
SELECT id, queue, task, payload_json, attempts, max_attempts, lease_token, seconds_to_deadline, run_json,
       checkpoint_json, headers_json, key
FROM queueworker.claim_fair_tasks(%(queue)s::text, %(limit)s::integer, %(worker)s::uuid, %(lease_seconds)s::float8,
                                     %(timeout_seconds)s::float8, true);

-- name: lock_queue
-- Locks a flow-controlled queue's row in the claim's transaction before `claim_limited` runs. It must
-- be a statement of its own: in READ COMMITTED a statement reads from a snapshot taken when it
-- starts, so a claim that waited for the row inside its own statement would count the running tasks
-- as they were before the claim it waited for (two claimers would each fill the whole cap).
-- The claim commits durably (`synchronous_commit`, for this transaction only), whatever
-- --async-claim-commit says: a claim a Postgres crash lost would take the tokens it charged and
-- the running tasks it counted with it, while its worker runs them, and the limits would no longer
-- hold (docs/flow-control.md). It is planned once per connection (`plan_cache_mode`, for this
-- transaction only), as `claim` is and for the same reasons: planning it for its parameters took
-- 0.5-0.8 ms of every claim, all of it under the lock that serialises the queue's claims, and it
-- takes its rows by `id = ANY(...)`, so its generic plan reads what a custom one reads
-- (tests/test_claim_plans.py). Without sequential scans: a plan kept for the connection stays
-- until an ANALYZE of the table, and one made for a near-empty queue would otherwise read the whole
-- table at every claim once a backlog came (docs/architecture.md, "A generic plan must not depend on
-- the table's size"; tests/test_stale_plans.py).
SELECT set_config('synchronous_commit', 'on', true), set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('enable_seqscan', 'off', true)
FROM queueworker.queues WHERE name = %(queue)s FOR NO KEY UPDATE;

-- name: lock_keys
-- `lock_queue` for a key-limited queue (migration 021), before `claim_keys`: locks the queue's row
-- and ends the key pauses whose time has passed (queueworker.lock_key_limited_queue,
-- migrations/functions/76_key_limits.sql); `true`: this claim knows per-key breakers (migration 022).
-- The `claim_keys` that follows in the same transaction is planned once per connection, not for
-- each claim (`plan_cache_mode`, for this transaction only; the session forces custom plans): its
-- planning took about 2 ms, all of it under the lock that serialises the queue's claims, and its
-- generic plan reads the same buffers as a custom one (the scans are all bounded by its LIMITs).
-- Durable and without sequential scans, as `lock_queue`'s claims.
SELECT queueworker.lock_key_limited_queue(%(queue)s, true), set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('enable_seqscan', 'off', true), set_config('synchronous_commit', 'on', true);

-- name: claim_limited
-- The claim of a queue with flow control, after `lock_queue` in the same transaction. Its row is
-- locked, so concurrent claimers take turns and every limit holds exactly: nothing while paused or
-- while the breaker is open; one probe task once the breaker's cooldown has passed (the breaker goes
-- half-open; a probe lost without an outcome lets another one through after the cooldown); no more
-- than the token bucket holds (refilled at `rate_per_second`, at most `burst`), and no more than
-- `max_running` minus the queue's running tasks. The bucket is charged for what was claimed
-- (`charged`, which leaves the queue's row alone when it has neither a rate nor an open breaker). A
-- queue whose row went away meanwhile is claimed up to the limit, as the plain claim would.
-- Otherwise as `claim`: `chosen` narrows what `picked` locked to what the limits allow.
WITH settings AS MATERIALIZED (
    SELECT q.*, CASE WHEN q.rate_per_second IS NOT NULL
                     THEN least(q.burst, q.tokens + q.rate_per_second * extract(epoch FROM now() - q.tokens_at))
                END AS level
    FROM queueworker.queues q WHERE q.name = %(queue)s
    FOR NO KEY UPDATE
), allowance AS MATERIALIZED (
    SELECT s.name, s.level, s.breaker_state,
           CASE WHEN s.paused_until > now() THEN 0
                WHEN s.breaker_state <> 'closed'
                     AND now() < s.breaker_changed_at + make_interval(secs => s.breaker_cooldown_seconds) THEN 0
                ELSE greatest(0, least(
                    %(limit)s,
                    CASE WHEN s.breaker_state <> 'closed' THEN 1 END,
                    floor(s.level)::integer,
                    s.max_running - (SELECT count(*) FROM queueworker.tasks_active r
                                     WHERE r.queue = s.name AND r.state = 'running')::integer))
           END AS n
    FROM settings s
), picked AS MATERIALIZED (
    SELECT id, priority, run_after FROM queueworker.tasks_active
    WHERE state = 'pending' AND NOT delayed AND queue = %(queue)s AND run_after <= now()
      AND coalesce((SELECT n FROM allowance), 1) > 0
    ORDER BY priority DESC, run_after, id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), chosen AS (
    SELECT id FROM picked ORDER BY priority DESC, run_after, id
    LIMIT coalesce((SELECT n FROM allowance), %(limit)s)
), claimed AS (
    UPDATE queueworker.tasks_active t
    SET state = 'running', attempts = t.attempts + 1, lease_owner = %(worker)s,
        lease_token = t.lease_token + 1,
        leased_until = statement_timestamp() + make_interval(secs => %(lease_seconds)s),
        deadline_at = statement_timestamp()
                      + make_interval(secs => coalesce(t.timeout_seconds, %(timeout_seconds)s::float8)),
        started_at = statement_timestamp(), updated_at = statement_timestamp()
    WHERE t.id = ANY(ARRAY(SELECT id FROM chosen)) AND t.state = 'pending'
    RETURNING t.id, t.queue, t.task, t.payload::text AS payload_json, t.attempts, t.max_attempts, t.lease_token,
              extract(epoch FROM t.deadline_at - statement_timestamp())::float8 AS seconds_to_deadline,
              CASE WHEN t.run_id IS NOT NULL THEN (
                  SELECT jsonb_build_object('id', r.id, 'name', r.name, 'partition', t.run_partition,
                                            'watermark', r.watermark, 'watermark_before', r.watermark_before,
                                            'forced', r.forced)::text
                  FROM queueworker.runs r WHERE r.id = t.run_id) END AS run_json,
              t.checkpoint::text AS checkpoint_json, t.headers::text AS headers_json, t.key
), audited AS (
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT id, 'pending', 'running', %(worker)s, lease_token, jsonb_build_object('attempts', attempts)
    FROM claimed
), charged AS (
    UPDATE queueworker.queues q
    SET tokens = coalesce(a.level - (SELECT count(*) FROM claimed), q.tokens), tokens_at = now(),
        breaker_state = CASE WHEN a.breaker_state <> 'closed' AND EXISTS (SELECT FROM claimed)
                             THEN 'half_open' ELSE q.breaker_state END,
        breaker_changed_at = CASE WHEN a.breaker_state <> 'closed' AND EXISTS (SELECT FROM claimed)
                                  THEN now() ELSE q.breaker_changed_at END
    FROM allowance a WHERE q.name = a.name AND (a.level IS NOT NULL OR a.breaker_state <> 'closed')
)
SELECT id, queue, task, payload_json, attempts, max_attempts, lease_token, seconds_to_deadline, run_json,
       checkpoint_json, headers_json, key
FROM claimed;

-- name: claim_limited_fair
-- The claim of a keyed queue with flow control (migration 020), after `lock_queue`: the limits of
-- `claim_limited`, the order and the safety net of `claim_fair` (`chosen` keeps the tagged tasks'
-- order, then the untagged ones'). A key-limited queue (migration 021) is `claim_keys`'s: here it
-- is allowed nothing (a worker that has not heard of its key limits yet).
WITH settings AS MATERIALIZED (
    SELECT q.*, CASE WHEN q.rate_per_second IS NOT NULL
                     THEN least(q.burst, q.tokens + q.rate_per_second * extract(epoch FROM now() - q.tokens_at))
                END AS level
    FROM queueworker.queues q WHERE q.name = %(queue)s
    FOR NO KEY UPDATE
), allowance AS MATERIALIZED (
    SELECT s.name, s.level, s.breaker_state,
           CASE WHEN s.paused_until > now() OR s.key_limited THEN 0
                WHEN s.breaker_state <> 'closed'
                     AND now() < s.breaker_changed_at + make_interval(secs => s.breaker_cooldown_seconds) THEN 0
                ELSE greatest(0, least(
                    %(limit)s,
                    CASE WHEN s.breaker_state <> 'closed' THEN 1 END,
                    floor(s.level)::integer,
                    s.max_running - (SELECT count(*) FROM queueworker.tasks_active r
                                     WHERE r.queue = s.name AND r.state = 'running')::integer))
           END AS n
    FROM settings s
), fair AS MATERIALIZED (
    SELECT id, priority, fair_tag FROM queueworker.tasks_active
    WHERE state = 'pending' AND NOT delayed AND fair_tag IS NOT NULL AND queue = %(queue)s AND run_after <= now()
      AND coalesce((SELECT n FROM allowance), 1) > 0
    ORDER BY priority DESC, fair_tag, id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), untagged AS MATERIALIZED (
    SELECT id, priority, run_after FROM queueworker.tasks_active
    WHERE state = 'pending' AND NOT delayed AND queue = %(queue)s AND run_after <= now() AND fair_tag IS NULL
      AND coalesce((SELECT n FROM allowance), 1) > 0
    ORDER BY priority DESC, run_after, id
    LIMIT %(limit)s - (SELECT count(*) FROM fair)
    FOR NO KEY UPDATE SKIP LOCKED
), chosen AS (
    SELECT id FROM (SELECT id, 1 AS pass, priority, fair_tag, NULL::timestamptz AS run_after FROM fair
                    UNION ALL SELECT id, 2, priority, NULL, run_after FROM untagged) AS p
    ORDER BY pass, priority DESC, fair_tag, run_after, id
    LIMIT coalesce((SELECT n FROM allowance), %(limit)s)
), claimed AS (
    UPDATE queueworker.tasks_active t
    SET state = 'running', attempts = t.attempts + 1, lease_owner = %(worker)s,
        lease_token = t.lease_token + 1, fair_tag = -coalesce(t.fair_tag, 1),
        leased_until = statement_timestamp() + make_interval(secs => %(lease_seconds)s),
        deadline_at = statement_timestamp()
                      + make_interval(secs => coalesce(t.timeout_seconds, %(timeout_seconds)s::float8)),
        started_at = statement_timestamp(), updated_at = statement_timestamp()
    WHERE t.id = ANY(ARRAY(SELECT id FROM chosen)) AND t.state = 'pending'
    RETURNING t.id, t.queue, t.task, t.payload::text AS payload_json, t.attempts, t.max_attempts, t.lease_token,
              extract(epoch FROM t.deadline_at - statement_timestamp())::float8 AS seconds_to_deadline,
              CASE WHEN t.run_id IS NOT NULL THEN (
                  SELECT jsonb_build_object('id', r.id, 'name', r.name, 'partition', t.run_partition,
                                            'watermark', r.watermark, 'watermark_before', r.watermark_before,
                                            'forced', r.forced)::text
                  FROM queueworker.runs r WHERE r.id = t.run_id) END AS run_json,
              t.checkpoint::text AS checkpoint_json, t.headers::text AS headers_json, t.key
), audited AS (
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT id, 'pending', 'running', %(worker)s, lease_token, jsonb_build_object('attempts', attempts)
    FROM claimed
), charged AS (
    UPDATE queueworker.queues q
    SET tokens = coalesce(a.level - (SELECT count(*) FROM claimed), q.tokens), tokens_at = now(),
        breaker_state = CASE WHEN a.breaker_state <> 'closed' AND EXISTS (SELECT FROM claimed)
                             THEN 'half_open' ELSE q.breaker_state END,
        breaker_changed_at = CASE WHEN a.breaker_state <> 'closed' AND EXISTS (SELECT FROM claimed)
                                  THEN now() ELSE q.breaker_changed_at END
    FROM allowance a WHERE q.name = a.name AND (a.level IS NOT NULL OR a.breaker_state <> 'closed')
)
SELECT id, queue, task, payload_json, attempts, max_attempts, lease_token, seconds_to_deadline, run_json,
       checkpoint_json, headers_json, key
FROM claimed;

-- name: claim_keys
-- The claim of a key-limited queue (migration 021, docs/flow-control.md), after `lock_keys`: the
-- queue's own limits as `claim_limited_fair`, and per key (the tasks without one are the key '')
-- no more running than its cap, no more started than its token bucket holds, nothing while it is
-- paused. A held key loses its turn: the claim passes over its tasks to the next key's. The lock
-- serialises the queue's claimers and this statement's snapshot is taken after it, so every limit
-- holds exactly, whatever the number of workers.
--
-- The cost does not grow with the number of keys. `held`, the keys allowed nothing, comes from small
-- sets: the keys paused (`queue_keys_paused`), those at their cap (the queue's running tasks per key,
-- `running`, from `tasks_running_keys`: O(running tasks)), those out of tokens (`key_state_waiting`).
-- `candidates` reads the line in fair order (the untagged tasks after the tagged ones, as
-- `claim_fair`'s safety net), skips the held keys' tasks and keeps 2 × `limit` of the others: its
-- inner LIMITs stop it after 200 + 4 × `limit` tasks read (each part), so a claim may find nothing
-- when that many consecutive waiting tasks all belong to held keys, though others wait behind
-- (the worker comes back once it has written outcomes of the queue, at its next poll, or when a
-- token is due). The untagged part reads that many of the queue's waiting tasks in line and keeps
-- the untagged ones: filtering for them inside the scan would read the whole backlog whenever the
-- tagged part comes up short, at every claim while every key with tasks waiting is at its cap
-- (tests/test_key_limits.py). Nothing blocks between the scan and the outer LIMIT: only the rows
-- needed are read. Each key met there is probed for its own
-- settings and its bucket (`keys`: one probe of each primary key, the LIMITs keep the planner from
-- reading all the queue's rows instead; a key without a `key_state` row has a full bucket) and allowed
-- the least of its cap less its running tasks and its whole tokens; `ranked` keeps that many of its
-- tasks, in line; `chosen` the first `limit` of those the queue allows. A queue none of whose keys
-- has a setting of its own (`queues.key_limits` false, kept with `queue_keys` in the same
-- transaction by migrations/functions/76_key_limits.sql) is not probed for keys' settings at all:
-- the defaults apply. `locked` skips a row someone else holds (a cancel). Claimed tasks keep their
-- tag negated (`claim_fair`). The buckets of the keys claimed from are charged in `charged_keys`
-- (`next_token_at`: when the key has a whole token again, NULL while it has one), the queue's in
-- `charged`, which leaves the queue's row alone when it has neither a rate nor an open breaker.
-- Each chosen task carries its key's bucket and probe through `locked` and `claimed`, so that
-- `charged_keys` counts the claimed rows by key without joining them back to `keys`: a join of two
-- CTEs, which the generic plan (its estimates are a row or two) made a nested loop comparing every
-- claimed task with every key met, 4,000 comparisons in a claim of 46 tasks over 92 candidates.
--
-- With a per-key breaker (migration 022), a key whose breaker is not closed is held until its
-- cooldown has passed since it opened (or since its probe was claimed: a probe lost without an
-- outcome lets another one through after the cooldown); then it is allowed one task, its probe, and
-- `charged_keys` moves it to half-open. `held_keys` are the keys this worker holds back itself: a
-- failure of theirs is on its way to their breaker, and may be the one that opens it.
WITH settings AS MATERIALIZED (
    SELECT q.*, CASE WHEN q.rate_per_second IS NOT NULL
                     THEN least(q.burst, q.tokens + q.rate_per_second * extract(epoch FROM now() - q.tokens_at))
                END AS level
    FROM queueworker.queues q WHERE q.name = %(queue)s
    FOR NO KEY UPDATE
), allowance AS MATERIALIZED (
    SELECT s.name, s.level, s.breaker_state, s.key_rate_per_second, s.key_burst, s.key_max_running,
           s.key_breaker_failures, s.key_breaker_cooldown_seconds, s.key_limits,
           CASE WHEN s.paused_until > now() THEN 0
                WHEN s.breaker_state <> 'closed'
                     AND now() < s.breaker_changed_at + make_interval(secs => s.breaker_cooldown_seconds) THEN 0
                ELSE greatest(0, least(
                    %(limit)s,
                    CASE WHEN s.breaker_state <> 'closed' THEN 1 END,
                    floor(s.level)::integer,
                    CASE WHEN s.max_running IS NOT NULL
                         THEN s.max_running - (SELECT count(*) FROM queueworker.tasks_active r
                                               WHERE r.queue = s.name AND r.state = 'running')::integer END))
           END AS n
    FROM settings s
), running AS MATERIALIZED (
    SELECT coalesce(r.key, '') AS key, count(*)::integer AS n
    FROM queueworker.tasks_active r
    WHERE r.queue = %(queue)s AND r.state = 'running' AND r.fair_tag IS NOT NULL
    GROUP BY 1
), held AS MATERIALIZED (
    SELECT k.key FROM queueworker.queue_keys k
    WHERE k.queue = %(queue)s AND k.paused_until IS NOT NULL AND k.paused_until > now()
    UNION
    SELECT r.key FROM running r CROSS JOIN allowance a
    WHERE r.n >= coalesce(CASE WHEN a.key_limits THEN (SELECT k.max_running FROM queueworker.queue_keys k
                                                       WHERE k.queue = %(queue)s AND k.key = r.key) END,
                          a.key_max_running)
    UNION
    SELECT b.key FROM queueworker.key_state b
    WHERE b.queue = %(queue)s AND b.next_token_at IS NOT NULL AND b.next_token_at > now()
    UNION
    SELECT b.key FROM queueworker.key_state b CROSS JOIN allowance a
    WHERE b.queue = %(queue)s AND b.breaker_state <> 'closed' AND a.key_breaker_failures IS NOT NULL
      AND now() < b.breaker_changed_at + make_interval(secs => a.key_breaker_cooldown_seconds)
    UNION
    SELECT unnest(%(held_keys)s::text[])
), candidates AS MATERIALIZED (
    SELECT w.* FROM (
        SELECT * FROM (
            SELECT id, coalesce(key, '') AS key, 1 AS pass, priority, fair_tag, NULL::timestamptz AS run_after
            FROM queueworker.tasks_active
            WHERE state = 'pending' AND NOT delayed AND fair_tag IS NOT NULL AND queue = %(queue)s
              AND run_after <= now() AND coalesce((SELECT n FROM allowance), 1) > 0
            ORDER BY priority DESC, fair_tag, id
            LIMIT 200 + 4 * %(limit)s) AS tagged
        UNION ALL
        SELECT head.id, head.key, 2 AS pass, head.priority, NULL::float8 AS fair_tag, head.run_after FROM (
            SELECT id, coalesce(key, '') AS key, priority, run_after, fair_tag
            FROM queueworker.tasks_active
            WHERE state = 'pending' AND NOT delayed AND queue = %(queue)s
              AND run_after <= now() AND coalesce((SELECT n FROM allowance), 1) > 0
            ORDER BY priority DESC, run_after, id
            LIMIT 200 + 4 * %(limit)s) AS head
        WHERE head.fair_tag IS NULL
    ) AS w
    WHERE w.key NOT IN (SELECT h.key FROM held h)
    LIMIT 2 * %(limit)s
), keys AS MATERIALIZED (
    SELECT c.key, c.rate, c.paused, c.probe,
           CASE WHEN c.rate IS NOT NULL
                THEN least(c.burst, coalesce(c.tokens + c.rate * extract(epoch FROM now() - c.tokens_at), c.burst))
           END AS level,
           c.max_running - c.running AS slots
    FROM (SELECT d.key, coalesce(k.paused_until > now(), false) AS paused,
                 coalesce(k.rate_per_second, a.key_rate_per_second) AS rate,
                 CASE WHEN k.rate_per_second IS NOT NULL THEN k.burst ELSE a.key_burst END AS burst,
                 coalesce(k.max_running, a.key_max_running) AS max_running, coalesce(r.n, 0) AS running,
                 b.tokens, b.tokens_at,
                 coalesce(a.key_breaker_failures IS NOT NULL AND b.breaker_state <> 'closed', false) AS probe
          FROM (SELECT DISTINCT key FROM candidates) AS d
          LEFT JOIN running r ON r.key = d.key
          CROSS JOIN allowance a
          LEFT JOIN LATERAL (SELECT * FROM queueworker.queue_keys k
                             WHERE a.key_limits AND k.queue = %(queue)s AND k.key = d.key LIMIT 1) AS k ON true
          LEFT JOIN LATERAL (SELECT * FROM queueworker.key_state b
                             WHERE b.queue = %(queue)s AND b.key = d.key LIMIT 1) AS b ON true) AS c
), ranked AS (
    SELECT s.id, s.key, s.pass, s.priority, s.fair_tag, s.run_after, k.level, k.rate, k.probe,
           row_number() OVER (PARTITION BY s.key ORDER BY s.pass, s.priority DESC, s.fair_tag, s.run_after, s.id)
               AS rank,
           CASE WHEN k.paused THEN 0
                ELSE least(k.slots, floor(k.level)::integer, CASE WHEN k.probe THEN 1 END) END AS allowed
    FROM candidates s JOIN keys k ON k.key = s.key
), chosen AS MATERIALIZED (
    SELECT id, key, level, rate, probe FROM ranked WHERE allowed IS NULL OR rank <= allowed
    ORDER BY pass, priority DESC, fair_tag, run_after, id
    LIMIT coalesce((SELECT n FROM allowance), %(limit)s)
), locked AS MATERIALIZED (
    SELECT c.id, c.key, c.level, c.rate, c.probe
    FROM chosen c JOIN queueworker.tasks_active t ON t.id = c.id
    WHERE t.state = 'pending'
    FOR NO KEY UPDATE OF t SKIP LOCKED
), claimed AS (
    UPDATE queueworker.tasks_active t
    SET state = 'running', attempts = t.attempts + 1, lease_owner = %(worker)s,
        lease_token = t.lease_token + 1, fair_tag = -coalesce(t.fair_tag, 1),
        leased_until = statement_timestamp() + make_interval(secs => %(lease_seconds)s),
        deadline_at = statement_timestamp()
                      + make_interval(secs => coalesce(t.timeout_seconds, %(timeout_seconds)s::float8)),
        started_at = statement_timestamp(), updated_at = statement_timestamp()
    FROM locked
    WHERE t.id = locked.id AND t.state = 'pending'
    RETURNING t.id, t.queue, t.task, t.payload::text AS payload_json, t.attempts, t.max_attempts, t.lease_token,
              extract(epoch FROM t.deadline_at - statement_timestamp())::float8 AS seconds_to_deadline,
              CASE WHEN t.run_id IS NOT NULL THEN (
                  SELECT jsonb_build_object('id', r.id, 'name', r.name, 'partition', t.run_partition,
                                            'watermark', r.watermark, 'watermark_before', r.watermark_before,
                                            'forced', r.forced)::text
                  FROM queueworker.runs r WHERE r.id = t.run_id) END AS run_json,
              t.checkpoint::text AS checkpoint_json, t.headers::text AS headers_json, t.key,
              locked.key AS charged_key, locked.level, locked.rate, locked.probe
), audited AS (
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT id, 'pending', 'running', %(worker)s, lease_token, jsonb_build_object('attempts', attempts)
    FROM claimed
), charged_keys AS (
    INSERT INTO queueworker.key_state AS b (queue, key, tokens, tokens_at, next_token_at, breaker_state,
                                            breaker_changed_at)
    SELECT %(queue)s, c.key, c.level - c.n, CASE WHEN c.rate IS NOT NULL THEN now() END,
           CASE WHEN c.level - c.n < 1 THEN now() + make_interval(secs => (1 - (c.level - c.n)) / c.rate) END,
           CASE WHEN c.probe THEN 'half_open' ELSE 'closed' END, CASE WHEN c.probe THEN now() END
    FROM (SELECT charged_key AS key, level, rate, probe, count(*) AS n FROM claimed
          WHERE rate IS NOT NULL OR probe GROUP BY 1, 2, 3, 4) AS c
    ORDER BY c.key  -- the order RECORD_KEY_OUTCOMES locks them in: no deadlock between the two
    ON CONFLICT (queue, key) DO UPDATE
    SET tokens = EXCLUDED.tokens, tokens_at = EXCLUDED.tokens_at, next_token_at = EXCLUDED.next_token_at,
        breaker_state = CASE WHEN EXCLUDED.breaker_changed_at IS NOT NULL THEN 'half_open' ELSE b.breaker_state END,
        breaker_changed_at = coalesce(EXCLUDED.breaker_changed_at, b.breaker_changed_at)
), charged AS (
    UPDATE queueworker.queues q
    SET tokens = coalesce(a.level - (SELECT count(*) FROM claimed), q.tokens), tokens_at = now(),
        breaker_state = CASE WHEN a.breaker_state <> 'closed' AND EXISTS (SELECT FROM claimed)
                             THEN 'half_open' ELSE q.breaker_state END,
        breaker_changed_at = CASE WHEN a.breaker_state <> 'closed' AND EXISTS (SELECT FROM claimed)
                                  THEN now() ELSE q.breaker_changed_at END
    FROM allowance a WHERE q.name = a.name AND (a.level IS NOT NULL OR a.breaker_state <> 'closed')
)
SELECT id, queue, task, payload_json, attempts, max_attempts, lease_token, seconds_to_deadline, run_json,
       checkpoint_json, headers_json, key
FROM claimed;

-- name: register_worker
-- Registers a worker (its `workers` row) at start, before its first claim, or refreshes the row of
-- one already registered. `heartbeat` does the same in its first step.
INSERT INTO queueworker.workers
        (id, hostname, pod_name, pod_namespace, pid, queues, concurrency, running, draining, version)
    VALUES (%(worker)s, %(hostname)s, %(pod_name)s, %(pod_namespace)s, %(pid)s, %(queues)s,
            %(concurrency)s, %(running)s, %(draining)s, %(version)s)
    ON CONFLICT (id) DO UPDATE
    SET heartbeat_at = now(), running = EXCLUDED.running, draining = EXCLUDED.draining;

-- name: heartbeat
-- Extends the leases this worker still holds and refreshes its `workers` row, in one statement.
-- Leases past their hard deadline are not extended, but still reported as held: the attempt's own
-- deadline ends it and reports DeadlineExceeded. A held task whose row another transaction has
-- locked (above all this worker's own completion of it, which may be waiting for a lock of its
-- own) is passed over (SKIP LOCKED) and reported as held but not extended: a blocked completion
-- never holds back the beat that keeps the other leases alive, and the next beat tries it again.
-- Each held task's progress goes along, unless the row holds a later report (`at`, the worker's
-- clock when the handler reported it): a beat whose progress was read before a checkpoint wrote a
-- newer one (the handler's thread goes on while the beat waits for its connection) must not put
-- the older one back, where the task's success would keep it. jsonb's own order compares the two
-- (numbers by value, never an error, whatever a row holds); a report without `at` is taken.
WITH me AS (
    INSERT INTO queueworker.workers
        (id, hostname, pod_name, pod_namespace, pid, queues, concurrency, running, draining, version)
    VALUES (%(worker)s, %(hostname)s, %(pod_name)s, %(pod_namespace)s, %(pid)s, %(queues)s,
            %(concurrency)s, %(running)s, %(draining)s, %(version)s)
    ON CONFLICT (id) DO UPDATE
    SET heartbeat_at = now(), running = EXCLUDED.running, draining = EXCLUDED.draining
), held AS MATERIALIZED (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(progresses)s::jsonb[]) AS h(id, token, progress)
), locked AS MATERIALIZED (
    SELECT t.id FROM queueworker.tasks t JOIN held h ON t.id = h.id
    WHERE t.lease_token = h.token AND t.state = 'running'
    FOR NO KEY UPDATE OF t SKIP LOCKED
), extended AS (
    UPDATE queueworker.tasks t
    SET leased_until = CASE WHEN t.deadline_at > now() THEN now() + make_interval(secs => %(lease_seconds)s)
                            ELSE t.leased_until END,
        progress = CASE WHEN t.progress -> 'at' > h.progress -> 'at' THEN t.progress
                        ELSE coalesce(h.progress, t.progress) END
    FROM locked l JOIN held h ON h.id = l.id
    WHERE t.id = l.id
    RETURNING t.id, t.lease_token, t.deadline_at > now() AS extended
)
SELECT id, lease_token, extended FROM extended
UNION ALL
SELECT t.id, t.lease_token, false FROM queueworker.tasks t JOIN held h ON t.id = h.id
WHERE t.lease_token = h.token AND t.state = 'running' AND t.id NOT IN (SELECT id FROM locked);

-- name: save_checkpoint
-- `ctx.save_checkpoint`: fenced by the lease like every write of an attempt, and aimed at the
-- active partition (its row is there while it runs), so no audit trigger runs for a change that
-- is not a transition. The latest progress goes along, unless the row holds a later one (as in
-- `heartbeat`).
UPDATE queueworker.tasks_active
SET checkpoint = %(checkpoint)s::jsonb,
    progress = CASE WHEN progress -> 'at' > %(progress)s::jsonb -> 'at' THEN progress
                    ELSE coalesce(%(progress)s::jsonb, progress) END,
    updated_at = now()
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
RETURNING id, lease_token;

-- name: cancelled_among
-- Which of the leases a heartbeat found gone were cancelled (the worker stops those handlers with
-- the reason "cancelled" rather than "lease lost").
SELECT id FROM queueworker.tasks
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'cancelled';

-- name: cancelled_leases
-- Which of these attempts (task id, lease token) were really cancelled. A notification on
-- queueworker_cancel is only a hint (any login may send one, with ids and tokens it has seen): the
-- worker asks this before it stops a handler the notification named, and a worker that cannot
-- listen polls it for every running attempt. A cancel keeps the lease token, so an attempt of a
-- task that was cancelled, retried and leased again (a new token) is not taken for the old one.
SELECT id, lease_token FROM queueworker.tasks
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'cancelled'
  AND (id, lease_token) IN (SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]));

-- name: deregister_worker
-- The last statement of a worker's clean stop. A worker killed instead is forgotten by `rescue`
-- once its row is older than the worker TTL.
DELETE FROM queueworker.workers WHERE id = %(worker)s;

-- name: completion_settings
-- Runs first, in the transaction of `complete_succeeded`: a generic plan, planned once per
-- connection. Planning the completion for its parameters took 0.25-0.5 ms of server time per flush,
-- while its plan depends on the number of running tasks (the table's statistics), not on its
-- parameters: the plan for the ids given and the generic one join the same way
-- (tests/test_claim_plans.py). For that transaction only: the session forces custom plans
-- (queueworker.db.connection.SESSION_SETTINGS). Without sequential scans, as `lock_queue` says:
-- planned while few tasks ran, it then reads the tasks it completes by primary key, never the
-- waiting ones.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true);

-- name: complete_succeeded
-- Moves the rows from `tasks_active` to `tasks_finished` itself and writes their audit rows, in
-- one statement: as cheap as an in-place UPDATE, where an UPDATE routed through the partitioned
-- parent costs Postgres 15 about twice as much per row. DML aimed at a partition does not fire
-- the parent's audit triggers, hence the explicit `audited` step (as in `claim`); `settled` makes
-- the tasks waiting on these pending in this same statement (migration 013: their counts of
-- prerequisites waiting go down; one index probe when nothing waits); `announced` tells `wait_for` (channel queueworker_finished)
-- of the tasks enqueued with notify_on_finish; `counted` counts them for the runs they belong to
-- (nothing to do for tasks of no run). Lists every column of queueworker.tasks: keep it in step
-- with the migrations (as `complete_continued`).
-- `done` finds its rows by primary key (`id = ANY(...)`), and compares the state with a value the
-- planner cannot see through (an InitPlan): written `state = 'running'`, it let the planner use the
-- running tasks' partial index, which a plan made while few tasks ran (the table's statistics)
-- prefers, and so hash every running task at every flush: 512 index entries and their rows read to
-- complete 8 at 64 worker processes of 8 slots (tests/test_stale_plans.py).
WITH done AS (
    DELETE FROM queueworker.tasks_active t
    USING unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(results)s::jsonb[]) AS c(id, token, result)
    WHERE t.id = ANY(%(ids)s::bigint[]) AND t.id = c.id AND t.lease_token = c.token
      AND t.state = (SELECT 'running'::queueworker.task_state)
    RETURNING t.id, t.queue, t.task, t.delayed, t.priority, t.run_after, t.attempts, t.max_attempts,
              t.rescues, t.timeout_seconds, t.payload, c.result, t.error, t.lease_owner, t.lease_token,
              t.created_at, t.started_at, t.spec_hash, t.dedupe_key, t.run_id, t.run_partition, t.progress,
              t.continued_from, t.notify_on_finish, t.headers, t.key
), moved AS (
    INSERT INTO queueworker.tasks_finished
        (id, queue, task, state, delayed, priority, run_after, attempts, max_attempts, rescues, timeout_seconds,
         payload, result, error, lease_owner, lease_token, leased_until, deadline_at, created_at, updated_at,
         started_at, finished_at, spec_hash, dedupe_key, run_id, run_partition, progress, continued_from,
         notify_on_finish, headers, key)
    OVERRIDING SYSTEM VALUE
    SELECT id, queue, task, 'succeeded', delayed, priority, run_after, attempts, max_attempts, rescues,
           timeout_seconds, payload, result, NULL, lease_owner, lease_token, NULL, NULL, created_at, now(),
           started_at, now(), spec_hash, dedupe_key, run_id, run_partition, progress, continued_from,
           notify_on_finish, headers, key
    FROM done
    RETURNING id, lease_token
), audited AS (
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT id, 'running', 'succeeded', lease_owner, lease_token, queueworker.transition_detail(attempts, NULL, error)
    FROM done
), settled AS (
    SELECT queueworker.settle_dependents(array_agg(id)) FROM moved
), announced AS (
    SELECT pg_notify('queueworker_finished', id::text) FROM done WHERE notify_on_finish
), counted AS (
    SELECT queueworker.count_run_outcomes(array_agg(id), array_agg(run_id), array_agg(run_partition),
                                          array_agg('running'::text), array_agg('succeeded'::text))
    FROM done WHERE run_id IS NOT NULL HAVING count(*) > 0
)
SELECT id, lease_token FROM moved LEFT JOIN counted ON true, settled, (SELECT count(*) FROM announced) AS a;

-- name: complete_continued
-- A handler returned Continue(payload, delay): the task succeeds and its next page is enqueued in
-- the same statement (same task, queue, priority, key, attempts allowed, timeout and run partition;
-- `continued_from` links them; its headers are the attempt's trace context when tracing, else the
-- task's own), so there is never one without the other. A page of a run's partition
-- is not the partition's outcome: the last page's is, so this statement counts nothing. The rest
-- is `complete_succeeded`'s (its rows found the same way); `woken` notifies the next pages' queues as
-- an enqueue does.
WITH done AS (
    DELETE FROM queueworker.tasks_active t
    USING unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(results)s::jsonb[],
                %(next_payloads)s::jsonb[], %(next_delays)s::float8[], %(next_headers)s::jsonb[])
         AS c(id, token, result, next_payload, next_delay, next_headers)
    WHERE t.id = ANY(%(ids)s::bigint[]) AND t.id = c.id AND t.lease_token = c.token
      AND t.state = (SELECT 'running'::queueworker.task_state)
    RETURNING t.id, t.queue, t.task, t.delayed, t.priority, t.run_after, t.attempts, t.max_attempts,
              t.rescues, t.timeout_seconds, t.payload, c.result, t.error, t.lease_owner, t.lease_token,
              t.created_at, t.started_at, t.spec_hash, t.dedupe_key, t.run_id, t.run_partition, t.progress,
              t.continued_from, t.notify_on_finish, t.headers, t.key, c.next_payload, c.next_delay,
              c.next_headers
), moved AS (
    INSERT INTO queueworker.tasks_finished
        (id, queue, task, state, delayed, priority, run_after, attempts, max_attempts, rescues, timeout_seconds,
         payload, result, error, lease_owner, lease_token, leased_until, deadline_at, created_at, updated_at,
         started_at, finished_at, spec_hash, dedupe_key, run_id, run_partition, progress, continued_from,
         notify_on_finish, headers, key)
    OVERRIDING SYSTEM VALUE
    SELECT id, queue, task, 'succeeded', delayed, priority, run_after, attempts, max_attempts, rescues,
           timeout_seconds, payload, result, NULL, lease_owner, lease_token, NULL, NULL, created_at, now(),
           started_at, now(), spec_hash, dedupe_key, run_id, run_partition, progress, continued_from,
           notify_on_finish, headers, key
    FROM done
    RETURNING id, lease_token
), audited AS (
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT id, 'running', 'succeeded', lease_owner, lease_token, queueworker.transition_detail(attempts, NULL, error)
    FROM done
), settled AS (
    SELECT queueworker.settle_dependents(array_agg(id)) FROM moved
), announced AS (
    SELECT pg_notify('queueworker_finished', id::text) FROM done WHERE notify_on_finish
), followed AS (
    INSERT INTO queueworker.tasks (queue, task, payload, priority, run_after, delayed, max_attempts,
                                   timeout_seconds, run_id, run_partition, continued_from, headers, key)
    SELECT d.queue, d.task, d.next_payload, d.priority, now() + make_interval(secs => d.next_delay),
           d.next_delay > 0, d.max_attempts, d.timeout_seconds, d.run_id, d.run_partition, d.id,
           coalesce(d.next_headers, d.headers), d.key
    FROM done d JOIN moved m ON m.id = d.id
    RETURNING id, queue, run_after
), woken AS (
    SELECT queueworker.wake_queue(queue, min(run_after)) FROM followed GROUP BY queue
)
SELECT m.id, m.lease_token FROM moved m, settled, (SELECT count(*) FROM woken) AS w,
       (SELECT count(*) FROM announced) AS a;

-- name: complete_failed
-- A retryable failure with attempts left waits out its backoff in `retrying` (the scheduler's
-- `promote_due` admits it again); anything else fails. Through the parent table: its triggers
-- write the audit rows and settle the failed tasks' dependents. Its rows are found by primary key,
-- the state compared as `complete_succeeded` compares it: written `state = 'running'`, statistics
-- taken while few tasks ran had the planner loop over the running tasks' index and compare each
-- entry with every failure of the batch (472 × 8 to fail 8 with 512 running); the comparison
-- also leaves `tasks_finished` out of the scan when the statement runs.
UPDATE queueworker.tasks t
SET state = CASE WHEN c.retryable AND t.attempts < t.max_attempts
                 THEN 'retrying' ELSE 'failed' END::queueworker.task_state,
    run_after = CASE WHEN c.retryable AND t.attempts < t.max_attempts
                     THEN now() + make_interval(secs => c.backoff_seconds) ELSE t.run_after END,
    finished_at = CASE WHEN c.retryable AND t.attempts < t.max_attempts THEN NULL ELSE now() END,
    error = c.error, updated_at = now(), leased_until = NULL, deadline_at = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(retryables)s::bool[],
            %(backoffs)s::float8[], %(errors)s::jsonb[]) AS c(id, token, retryable, backoff_seconds, error)
WHERE t.id = ANY(%(ids)s::bigint[]) AND t.id = c.id AND t.lease_token = c.token
  AND t.state = (SELECT 'running'::queueworker.task_state)
RETURNING t.id, t.lease_token, t.state::text AS state;

-- name: release
-- Graceful shutdown, once every outcome is flushed: hands back to `pending`, without consuming the
-- attempt, every task the database says this worker still holds, whatever the worker remembers
-- (attempts cut short by the drain, attempts it cancelled when their lease ran out by its own clock,
-- a claim whose answer never arrived), and wakes other workers. The task's error (and so its audit
-- row) says it was interrupted by a drain; queueworker_tasks_released_total counts them. The
-- notification is a queue's plain wake-up (channel queueworker, payload the queue).
WITH released AS (
    UPDATE queueworker.tasks t
    SET state = 'pending', attempts = greatest(t.attempts - 1, 0), run_after = now(), updated_at = now(),
        lease_owner = NULL, leased_until = NULL, deadline_at = NULL,
        error = jsonb_build_object('type', 'Drained', 'retryable', true, 'attempt', t.attempts,
                                   'message', 'interrupted: the worker stopped (a drain) before the task finished; '
                                              'handed back without spending the attempt')
    WHERE t.lease_owner = %(worker)s AND t.state = 'running'
    RETURNING t.id, t.queue
), notified AS (
    SELECT pg_notify('queueworker', queue) FROM released GROUP BY queue
)
SELECT id, queue, (SELECT count(*) FROM notified) AS notified FROM released;

-- name: hand_back
-- Hands tasks back to `pending` without consuming their attempt, due again after a delay: a
-- handler that snoozes (`raise Snooze(seconds)`, waiting on something outside), and a worker that
-- has no handler for a task's name (a grace is given), within the grace period counted from when a
-- worker first met the task unknown (a newer worker may have a handler: rolling deploys; a task
-- delayed for a day is not failed at its first claim). That moment travels in the error, as
-- `unknown_since`, UTC in ISO 8601, compared as text in the C collation ('~' after every digit: not
-- yet met): a value written by hand cannot fail the statement, only end the grace. The error says which, and the audit row shows it. Rows not
-- returned are stale, or past their grace.
UPDATE queueworker.tasks t
SET state = 'pending', delayed = true, attempts = greatest(t.attempts - 1, 0),
    run_after = now() + make_interval(secs => d.delay_seconds), updated_at = now(),
    error = CASE WHEN d.grace_seconds IS NULL THEN d.error
                 ELSE d.error || jsonb_build_object('unknown_since', coalesce(
                     CASE WHEN t.error ->> 'type' = 'UnknownTaskError' THEN t.error ->> 'unknown_since' END,
                     to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))) END,
    lease_owner = NULL, leased_until = NULL, deadline_at = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(delays)s::float8[], %(errors)s::jsonb[],
            %(graces)s::float8[]) AS d(id, token, delay_seconds, error, grace_seconds)
WHERE t.id = d.id AND t.lease_token = d.token AND t.state = 'running'
  AND (d.grace_seconds IS NULL
       OR coalesce(CASE WHEN t.error ->> 'type' = 'UnknownTaskError' THEN t.error ->> 'unknown_since' END, '~')
          COLLATE "C" > to_char((now() - make_interval(secs => d.grace_seconds)) AT TIME ZONE 'UTC',
                                'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
RETURNING t.id, t.lease_token;
