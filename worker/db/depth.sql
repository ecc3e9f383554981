-- What the controller runs against a queue's database (queueworker_controller.queuedb): the depth
-- of its queues each tick, the leases worker pods hold before a scale-in, and the LISTEN for
-- producers' announcements. It reads counts and leases, never payloads (docs/security.md).
-- Each statement is declared, with its parameter and row types, in queueworker/db/depth.py.
--
-- The depth is one cheap statement per database per tick, whatever the history size: ready and
-- retrying tasks are counted only up to %(cap)s (what scaling needs), running ones are bounded by
-- the fleet's concurrency, and the head-of-queue age reads a single claim-index entry. With
-- %(throughput)s, the last 5000 tasks the database finished (succeeded or failed) within the last
-- 60 seconds give each queue's finish rate and mean task duration: one bounded walk of the
-- finished-at index for the whole statement, however many queues and however busy. The three
-- queue_depth statements repeat that sample (`recent` and `sampled`) word for word; a test
-- (tests/test_controller_queuedb.py) holds them to it.
--
-- Each depth read also reads the database's connection budget (`budget`, repeated word for word
-- too; docs/controller.md, "The database's connection budget"): max_connections less the slots
-- reserved for superusers (and, from PostgreSQL 16, for pg_use_reserved_connections), and the
-- client backends of roles other than this login's, told apart by role (usesysid), never by
-- application_name, which any client sets. A login without pg_read_all_stats sees no backend_type
-- of other roles' sessions: those count whatever they are (background workers with a role, such
-- as the logical replication launcher, included), a few too many, on the safe side.

-- name: queue_depth
-- Each queue comes with a lookahead (seconds, or NULL for none): waiting tasks (delayed, or
-- retrying after their backoff) due by then count as due_soon, up to the cap, through the index
-- of waiting tasks. Without a lookahead those are the ones already due: the workers' scheduler
-- admits them to the claim index, but a fleet at zero replicas runs no scheduler, so they must
-- count. Blocked tasks (waiting on prerequisites) are reported, never scaled for, counted up to the
-- cap. Flow control (migration 009): a paused queue or an open breaker starts nothing whatever its
-- backlog; a cap on running tasks or a rate limit bounds the replicas worth running, and for a
-- rate, the mean duration of the queue's last 100 successes gives the slots it keeps busy
-- (Little's law). The durations are read from the database's last 5,000 finished tasks
-- (`durations`), the queue's last 100 successes among them: one bounded walk of the finished-at index
-- for the whole statement, where a walk per queue until its own 100 successes read the whole history
-- for a queue with fewer (every tick, 190 ms behind 1,000,000 finished tasks of other queues). A
-- queue none of whose successes is among them counts as not known yet (one replica, as before its
-- first success). Per-key limits (schema version 22): what the keys let run at once, and how many
-- keys with tasks ready are held, from queueworker.key_capacity (migrations/functions/78_key_capacity.sql),
-- called for key-limited queues only (in a CASE), with the same mean task duration for the keys' rates.
WITH recent AS MATERIALIZED (
    SELECT queue, started_at, finished_at FROM queueworker.tasks
    WHERE %(throughput)s AND state IN ('succeeded', 'failed') AND started_at IS NOT NULL
      AND finished_at > now() - make_interval(secs => 60)
    ORDER BY finished_at DESC LIMIT 5000
), sampled AS (  -- the seconds the sample covers: the whole window, unless the sample filled first
    SELECT CASE WHEN count(*) < 5000 THEN 60::float8
                ELSE greatest(extract(epoch FROM now() - min(finished_at))::float8, 0.001) END AS seconds
    FROM recent
), budget AS (  -- the server's connections this login's role may hold, and those other roles hold now
    SELECT current_setting('max_connections')::integer - current_setting('superuser_reserved_connections')::integer
               - coalesce(current_setting('reserved_connections', true)::integer, 0) AS connection_limit,
           (SELECT count(*) FROM pg_stat_activity a
            WHERE a.usesysid <> (SELECT r.oid FROM pg_roles r WHERE r.rolname = session_user)
              AND (a.backend_type = 'client backend' OR a.backend_type IS NULL))::integer AS other_role_connections
), durations AS MATERIALIZED (  -- where the limited queues' task durations come from (read only for those)
    SELECT d.queue, d.started_at, d.finished_at
    FROM (SELECT queue, state, started_at, finished_at FROM queueworker.tasks
          WHERE state IN ('succeeded', 'failed', 'cancelled') AND finished_at IS NOT NULL
          ORDER BY finished_at DESC LIMIT 5000) AS d
    WHERE d.state = 'succeeded' AND d.started_at IS NOT NULL
)
SELECT q.queue, q.lookahead,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE state = 'pending' AND NOT delayed AND queue = q.queue
                                AND run_after <= now()
                              LIMIT %(cap)s) AS r) AS ready,
       (SELECT count(*) FROM queueworker.tasks WHERE state = 'running' AND queue = q.queue) AS running,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE state = 'retrying' AND queue = q.queue
                              LIMIT %(cap)s) AS b) AS retrying,
       (SELECT extract(epoch FROM now() - run_after)::float8 FROM queueworker.tasks
        WHERE state = 'pending' AND NOT delayed AND queue = q.queue AND run_after <= now()
        ORDER BY priority DESC, run_after, id LIMIT 1) AS oldest_ready_age,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE state = 'blocked' AND queue = q.queue
                              LIMIT %(cap)s) AS w) AS blocked,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE (state = 'retrying' OR (state = 'pending' AND delayed)) AND queue = q.queue
                                AND run_after <= now() + make_interval(secs => coalesce(q.lookahead, 0))
                              LIMIT %(cap)s) AS s) AS due_soon,
       t.finish_rate, t.recent_task_seconds,
       (SELECT connection_limit FROM budget), (SELECT other_role_connections FROM budget),
       coalesce(f.paused, false) AS paused, coalesce(f.breaker_open, false) AS breaker_open,
       f.rate_per_second, f.max_running, f.mean_task_seconds,
       coalesce(f.key_limited, false) AS key_limited, (f.key_capacity ->> 'key_slots')::bigint AS key_slots,
       coalesce((f.key_capacity ->> 'keys_ready')::integer, 0) AS keys_ready,
       coalesce((f.key_capacity ->> 'keys_held')::integer, 0) AS keys_held
FROM unnest(%(queues)s::text[], %(lookaheads)s::float8[]) AS q(queue, lookahead)
LEFT JOIN LATERAL (
    SELECT count(*) / (SELECT seconds FROM sampled) AS finish_rate,
           avg(extract(epoch FROM r.finished_at - r.started_at))::float8 AS recent_task_seconds
    FROM recent r WHERE %(throughput)s AND r.queue = q.queue HAVING count(*) > 0) AS t ON true
LEFT JOIN LATERAL (
    SELECT m.*, CASE WHEN m.key_limited THEN queueworker.key_capacity(
                    m.name, least(%(cap)s, 100000)::integer, m.mean_task_seconds) END AS key_capacity
    FROM (SELECT l.name, l.paused_until > now() AS paused, l.breaker_state <> 'closed' AS breaker_open,
                 l.rate_per_second, l.max_running, l.key_limited,
                 CASE WHEN l.rate_per_second IS NOT NULL OR l.key_limited THEN (
                     SELECT avg(extract(epoch FROM d.finished_at - d.started_at))::float8
                     FROM (SELECT finished_at, started_at FROM durations
                           WHERE queue = l.name ORDER BY finished_at DESC LIMIT 100) AS d)
                 END AS mean_task_seconds
          FROM queueworker.queues l WHERE l.name = q.queue AND l.limited
          OFFSET 0) AS m) AS f ON true;  -- OFFSET 0: the mean is computed once, not again for the call

-- name: queue_depth_without_keys
-- queue_depth against a schema of versions 9 to 21 (flow control, but no per-key breaker: the
-- key capacity reads it): the queue's own limits, no per-key ones. Tried when queue_depth fails so.
WITH recent AS MATERIALIZED (
    SELECT queue, started_at, finished_at FROM queueworker.tasks
    WHERE %(throughput)s AND state IN ('succeeded', 'failed') AND started_at IS NOT NULL
      AND finished_at > now() - make_interval(secs => 60)
    ORDER BY finished_at DESC LIMIT 5000
), sampled AS (  -- the seconds the sample covers: the whole window, unless the sample filled first
    SELECT CASE WHEN count(*) < 5000 THEN 60::float8
                ELSE greatest(extract(epoch FROM now() - min(finished_at))::float8, 0.001) END AS seconds
    FROM recent
), budget AS (  -- the server's connections this login's role may hold, and those other roles hold now
    SELECT current_setting('max_connections')::integer - current_setting('superuser_reserved_connections')::integer
               - coalesce(current_setting('reserved_connections', true)::integer, 0) AS connection_limit,
           (SELECT count(*) FROM pg_stat_activity a
            WHERE a.usesysid <> (SELECT r.oid FROM pg_roles r WHERE r.rolname = session_user)
              AND (a.backend_type = 'client backend' OR a.backend_type IS NULL))::integer AS other_role_connections
), durations AS MATERIALIZED (  -- where the limited queues' task durations come from (read only for those)
    SELECT d.queue, d.started_at, d.finished_at
    FROM (SELECT queue, state, started_at, finished_at FROM queueworker.tasks
          WHERE state IN ('succeeded', 'failed', 'cancelled') AND finished_at IS NOT NULL
          ORDER BY finished_at DESC LIMIT 5000) AS d
    WHERE d.state = 'succeeded' AND d.started_at IS NOT NULL
)
SELECT q.queue, q.lookahead,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE state = 'pending' AND NOT delayed AND queue = q.queue
                                AND run_after <= now()
                              LIMIT %(cap)s) AS r) AS ready,
       (SELECT count(*) FROM queueworker.tasks WHERE state = 'running' AND queue = q.queue) AS running,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE state = 'retrying' AND queue = q.queue
                              LIMIT %(cap)s) AS b) AS retrying,
       (SELECT extract(epoch FROM now() - run_after)::float8 FROM queueworker.tasks
        WHERE state = 'pending' AND NOT delayed AND queue = q.queue AND run_after <= now()
        ORDER BY priority DESC, run_after, id LIMIT 1) AS oldest_ready_age,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE state = 'blocked' AND queue = q.queue
                              LIMIT %(cap)s) AS w) AS blocked,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE (state = 'retrying' OR (state = 'pending' AND delayed)) AND queue = q.queue
                                AND run_after <= now() + make_interval(secs => coalesce(q.lookahead, 0))
                              LIMIT %(cap)s) AS s) AS due_soon,
       t.finish_rate, t.recent_task_seconds,
       (SELECT connection_limit FROM budget), (SELECT other_role_connections FROM budget),
       coalesce(f.paused, false) AS paused, coalesce(f.breaker_open, false) AS breaker_open,
       f.rate_per_second, f.max_running, f.mean_task_seconds,
       false AS key_limited, NULL::bigint AS key_slots, 0 AS keys_ready, 0 AS keys_held
FROM unnest(%(queues)s::text[], %(lookaheads)s::float8[]) AS q(queue, lookahead)
LEFT JOIN LATERAL (
    SELECT count(*) / (SELECT seconds FROM sampled) AS finish_rate,
           avg(extract(epoch FROM r.finished_at - r.started_at))::float8 AS recent_task_seconds
    FROM recent r WHERE %(throughput)s AND r.queue = q.queue HAVING count(*) > 0) AS t ON true
LEFT JOIN LATERAL (
    SELECT l.paused_until > now() AS paused, l.breaker_state <> 'closed' AS breaker_open, l.rate_per_second,
           l.max_running,
           CASE WHEN l.rate_per_second IS NOT NULL THEN (
               SELECT avg(extract(epoch FROM d.finished_at - d.started_at))::float8
               FROM (SELECT finished_at, started_at FROM durations
                     WHERE queue = l.name ORDER BY finished_at DESC LIMIT 100) AS d)
           END AS mean_task_seconds
    FROM queueworker.queues l WHERE l.name = q.queue AND l.limited) AS f ON true;

-- name: queue_depth_without_flow
-- queue_depth against a schema older than version 9 (no queueworker.queues, no flow control): the
-- tenants a newer controller serves may run older workers. Tried when queue_depth fails so.
WITH recent AS MATERIALIZED (
    SELECT queue, started_at, finished_at FROM queueworker.tasks
    WHERE %(throughput)s AND state IN ('succeeded', 'failed') AND started_at IS NOT NULL
      AND finished_at > now() - make_interval(secs => 60)
    ORDER BY finished_at DESC LIMIT 5000
), sampled AS (  -- the seconds the sample covers: the whole window, unless the sample filled first
    SELECT CASE WHEN count(*) < 5000 THEN 60::float8
                ELSE greatest(extract(epoch FROM now() - min(finished_at))::float8, 0.001) END AS seconds
    FROM recent
), budget AS (  -- the server's connections this login's role may hold, and those other roles hold now
    SELECT current_setting('max_connections')::integer - current_setting('superuser_reserved_connections')::integer
               - coalesce(current_setting('reserved_connections', true)::integer, 0) AS connection_limit,
           (SELECT count(*) FROM pg_stat_activity a
            WHERE a.usesysid <> (SELECT r.oid FROM pg_roles r WHERE r.rolname = session_user)
              AND (a.backend_type = 'client backend' OR a.backend_type IS NULL))::integer AS other_role_connections
)
SELECT q.queue, q.lookahead,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE state = 'pending' AND NOT delayed AND queue = q.queue
                                AND run_after <= now()
                              LIMIT %(cap)s) AS r) AS ready,
       (SELECT count(*) FROM queueworker.tasks WHERE state = 'running' AND queue = q.queue) AS running,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE state = 'retrying' AND queue = q.queue
                              LIMIT %(cap)s) AS b) AS retrying,
       (SELECT extract(epoch FROM now() - run_after)::float8 FROM queueworker.tasks
        WHERE state = 'pending' AND NOT delayed AND queue = q.queue AND run_after <= now()
        ORDER BY priority DESC, run_after, id LIMIT 1) AS oldest_ready_age,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE state = 'blocked' AND queue = q.queue
                              LIMIT %(cap)s) AS w) AS blocked,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE (state = 'retrying' OR (state = 'pending' AND delayed)) AND queue = q.queue
                                AND run_after <= now() + make_interval(secs => coalesce(q.lookahead, 0))
                              LIMIT %(cap)s) AS s) AS due_soon,
       t.finish_rate, t.recent_task_seconds,
       (SELECT connection_limit FROM budget), (SELECT other_role_connections FROM budget),
       false AS paused, false AS breaker_open, NULL::float8 AS rate_per_second,
       NULL::integer AS max_running, NULL::float8 AS mean_task_seconds,
       false AS key_limited, NULL::bigint AS key_slots, 0 AS keys_ready, 0 AS keys_held
FROM unnest(%(queues)s::text[], %(lookaheads)s::float8[]) AS q(queue, lookahead)
LEFT JOIN LATERAL (
    SELECT count(*) / (SELECT seconds FROM sampled) AS finish_rate,
           avg(extract(epoch FROM r.finished_at - r.started_at))::float8 AS recent_task_seconds
    FROM recent r WHERE %(throughput)s AND r.queue = q.queue HAVING count(*) > 0) AS t ON true;

-- name: queue_depth_without_blocked
-- queue_depth against a schema older than version 5 (no `blocked` task state either): none blocked.
WITH recent AS MATERIALIZED (
    SELECT queue, started_at, finished_at FROM queueworker.tasks
    WHERE %(throughput)s AND state IN ('succeeded', 'failed') AND started_at IS NOT NULL
      AND finished_at > now() - make_interval(secs => 60)
    ORDER BY finished_at DESC LIMIT 5000
), sampled AS (  -- the seconds the sample covers: the whole window, unless the sample filled first
    SELECT CASE WHEN count(*) < 5000 THEN 60::float8
                ELSE greatest(extract(epoch FROM now() - min(finished_at))::float8, 0.001) END AS seconds
    FROM recent
), budget AS (  -- the server's connections this login's role may hold, and those other roles hold now
    SELECT current_setting('max_connections')::integer - current_setting('superuser_reserved_connections')::integer
               - coalesce(current_setting('reserved_connections', true)::integer, 0) AS connection_limit,
           (SELECT count(*) FROM pg_stat_activity a
            WHERE a.usesysid <> (SELECT r.oid FROM pg_roles r WHERE r.rolname = session_user)
              AND (a.backend_type = 'client backend' OR a.backend_type IS NULL))::integer AS other_role_connections
)
SELECT q.queue, q.lookahead,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE state = 'pending' AND NOT delayed AND queue = q.queue
                                AND run_after <= now()
                              LIMIT %(cap)s) AS r) AS ready,
       (SELECT count(*) FROM queueworker.tasks WHERE state = 'running' AND queue = q.queue) AS running,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE state = 'retrying' AND queue = q.queue
                              LIMIT %(cap)s) AS b) AS retrying,
       (SELECT extract(epoch FROM now() - run_after)::float8 FROM queueworker.tasks
        WHERE state = 'pending' AND NOT delayed AND queue = q.queue AND run_after <= now()
        ORDER BY priority DESC, run_after, id LIMIT 1) AS oldest_ready_age,
       0::bigint AS blocked,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE (state = 'retrying' OR (state = 'pending' AND delayed)) AND queue = q.queue
                                AND run_after <= now() + make_interval(secs => coalesce(q.lookahead, 0))
                              LIMIT %(cap)s) AS s) AS due_soon,
       t.finish_rate, t.recent_task_seconds,
       (SELECT connection_limit FROM budget), (SELECT other_role_connections FROM budget),
       false AS paused, false AS breaker_open, NULL::float8 AS rate_per_second,
       NULL::integer AS max_running, NULL::float8 AS mean_task_seconds,
       false AS key_limited, NULL::bigint AS key_slots, 0 AS keys_ready, 0 AS keys_held
FROM unnest(%(queues)s::text[], %(lookaheads)s::float8[]) AS q(queue, lookahead)
LEFT JOIN LATERAL (
    SELECT count(*) / (SELECT seconds FROM sampled) AS finish_rate,
           avg(extract(epoch FROM r.finished_at - r.started_at))::float8 AS recent_task_seconds
    FROM recent r WHERE %(throughput)s AND r.queue = q.queue HAVING count(*) > 0) AS t ON true;

-- name: worker_leases
-- The worker pods of one namespace serving a queue, with the leases they hold right now (counted
-- from the tasks, not the count of their last heartbeat) and the age of the oldest: read right
-- before a scale-in, to price pods so the idle ones go first (queueworker_controller.scalein).
-- Any login of the database can register workers, so the read is bounded whatever the table
-- holds: a pod name is at most 253 characters in Kubernetes (a longer one is cut, and matches no
-- pod), and at most 1000 workers are read (the controller refuses more rows than that).
SELECT left(w.pod_name, 253) AS pod_name, count(t.id)::int AS running, w.draining,
       extract(epoch FROM now() - min(t.started_at))::float8 AS oldest_lease_age
FROM queueworker.workers w
LEFT JOIN queueworker.tasks t ON t.lease_owner = w.id AND t.state = 'running'
WHERE w.pod_namespace = %(namespace)s AND w.pod_name IS NOT NULL
  AND %(queue)s = ANY(w.queues)
GROUP BY w.id, w.pod_name, w.running, w.draining
LIMIT 1000;
