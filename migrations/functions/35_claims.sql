-- queueworker functions: the claims that lock no queue (`claim_tasks`, `claim_fair_tasks`), which a
-- worker runs as `claim` and `claim_fair` (worker/db/lease.sql).
--
-- Repeatable (worker/migrate.py): applied after the versioned migrations whenever one was applied or a
-- file of migrations/functions/ changed; each function in its current form (CREATE OR REPLACE).
--
-- Why functions (schema version 26). A claim wants a generic plan, made once per connection (planning
-- it for its parameters cost about as much as running it), without sequential scans (a plan made for
-- a near-empty queue must not read the whole backlog later: tests/test_stale_plans.py), and, with
-- --async-claim-commit, a commit that does not wait for the disk; while the worker's sessions force
-- custom plans for everything else (queueworker.db.connection.SESSION_SETTINGS). Until version 25 a
-- statement of settings went before each claim in one pipeline: a round trip still, but psycopg sends
-- each statement of a pipeline, and its Sync, in a packet of its own, and an idle server went back
-- to sleep between them: a claim that woke an idle worker took about 0.2 ms more than one statement
-- (measured 2026-12-07, bench/notes.md). A PL/pgSQL function carries the settings with it (its SET
-- clauses, and `synchronous_commit` for the rest of the claim's transaction), keeps its plan for the
-- session whatever the client does (also through a pooler in transaction mode, where a client's
-- statements are never prepared and every claim was planned anew), and is called by one statement.
--
-- Each body is one statement that refers to the function's arguments by position: $1 the queue, $2
-- the most tasks to claim, $3 the worker, $4 the lease's seconds, $5 the deadline's seconds for a
-- task that sets none; so it reads, and can be prepared and explained, as the statement it is
-- (tests/test_claim_plans.py). Security invoker: a claim runs with its worker's rights, as before.

-- Leases up to `limit` pending tasks of a queue: highest priority first, then earliest due, then oldest.
-- `picked` is MATERIALIZED so the planner cannot turn the LIMIT into a nested loop that updates
-- more rows than asked for; FOR NO KEY UPDATE does not block the foreign keys that point at tasks;
-- SKIP LOCKED lets concurrent claimers take different rows instead of waiting for each other. Aimed
-- at the `tasks_active` partition (no routing through the parent), so it writes its own audit rows
-- (`audited`), which costs less than the parent's transition-table trigger. A queue with flow
-- control (a row in queueworker.queues that sets something: migration 009) is claimed by
-- `claim_limited` only, a keyed queue (migration 020) by `claim_fair` or `claim_limited_fair`: here
-- the guard picks nothing from either, an index probe of a tiny table per statement, run once (an
-- InitPlan: the LIMIT stays a plain parameter, so the planner keeps the index scan). Its plan is
-- generic (the SET clause), so it must not depend on the arguments: `claimed` takes
-- its rows by `id = ANY(...)`, an index scan of the primary key whatever their number, where a join
-- with `picked` would be sized from an unknown LIMIT (a tenth of the table) and hash the whole
-- partition. Every claim stamps its tasks with the statement's time (`statement_timestamp()`), not
-- the transaction's (`now()`), as every claim does: the transaction of a claim under a queue's lock
-- starts with the lock, which may wait, and a task claimed once its prerequisite's completion committed
-- must not read as started before that completion (tests/test_dependency_counts.py).
CREATE OR REPLACE FUNCTION queueworker.claim_tasks(queue_name text, claim_limit integer, worker_id uuid,
    lease_seconds float8, default_timeout_seconds float8, commit_without_waiting boolean)
RETURNS TABLE (id bigint, queue text, task text, payload_json text, attempts integer, max_attempts integer,
               lease_token bigint, seconds_to_deadline float8, run_json text, checkpoint_json text, headers_json text,
               key text)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
BEGIN
    IF commit_without_waiting THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT id, priority, run_after FROM queueworker.tasks_active
        WHERE state = 'pending' AND NOT delayed AND queue = $1 AND run_after <= now()
          AND NOT EXISTS (SELECT FROM queueworker.queues l WHERE l.name = $1 AND (l.limited OR l.keyed))
        ORDER BY priority DESC, run_after, id
        LIMIT $2
        FOR NO KEY UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE queueworker.tasks_active t
        SET state = 'running', attempts = t.attempts + 1, lease_owner = $3,
            lease_token = t.lease_token + 1,
            leased_until = statement_timestamp() + make_interval(secs => $4),
            deadline_at = statement_timestamp() + make_interval(secs => coalesce(t.timeout_seconds, $5)),
            started_at = statement_timestamp(), updated_at = statement_timestamp()
        WHERE t.id = ANY(ARRAY(SELECT id FROM picked)) AND t.state = 'pending'
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
        SELECT id, 'pending', 'running', $3, lease_token, jsonb_build_object('attempts', attempts)
        FROM claimed
    )
    SELECT id, queue, task, payload_json, attempts, max_attempts, lease_token, seconds_to_deadline, run_json,
           checkpoint_json, headers_json, key
    FROM claimed;
END
$$;

-- The claim of a keyed queue without flow control (migration 020, docs/flow-control.md): as
-- `claim`, in fair-share order: highest priority first, then the smallest virtual start tag (the
-- triggers of migrations/functions/75_fair_share.sql gave it), then the oldest: one scan of the
-- `tasks_fair` index, whatever the number of keys. A claimed task keeps its tag negated (a tag is
-- positive; 1 for a task without one): `tasks_running_keys` counts the running tasks of keyed queues
-- by it, and the trigger of migrations/functions/76_key_limits.sql tells this claim from an earlier
-- version's, which cleared it (the tag means nothing else once the task is not claimable, and is
-- given anew when it is claimable again). `untagged` is a safety net that costs nothing while
-- `fair` fills the claim (a LIMIT of 0 reads no row): a task of the queue without a tag (inserted
-- by a transaction that had not seen the queue become keyed) is claimed once the tagged ones are
-- all taken, never left behind. A queue with flow control is claimed by `claim_limited_fair`. It
-- runs with a generic plan, as `claim` does, and takes its rows by `id = ANY(...)` for the same reason.
CREATE OR REPLACE FUNCTION queueworker.claim_fair_tasks(queue_name text, claim_limit integer, worker_id uuid,
    lease_seconds float8, default_timeout_seconds float8, commit_without_waiting boolean)
RETURNS TABLE (id bigint, queue text, task text, payload_json text, attempts integer, max_attempts integer,
               lease_token bigint, seconds_to_deadline float8, run_json text, checkpoint_json text, headers_json text,
               key text)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
BEGIN
    IF commit_without_waiting THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY
    WITH fair AS MATERIALIZED (
        SELECT id, priority, fair_tag FROM queueworker.tasks_active
        WHERE state = 'pending' AND NOT delayed AND fair_tag IS NOT NULL AND queue = $1 AND run_after <= now()
          AND NOT EXISTS (SELECT FROM queueworker.queues l WHERE l.name = $1 AND l.limited)
        ORDER BY priority DESC, fair_tag, id
        LIMIT $2
        FOR NO KEY UPDATE SKIP LOCKED
    ), untagged AS MATERIALIZED (
        SELECT id FROM queueworker.tasks_active
        WHERE state = 'pending' AND NOT delayed AND queue = $1 AND run_after <= now() AND fair_tag IS NULL
          AND NOT EXISTS (SELECT FROM queueworker.queues l WHERE l.name = $1 AND l.limited)
        ORDER BY priority DESC, run_after, id
        LIMIT $2 - (SELECT count(*) FROM fair)
        FOR NO KEY UPDATE SKIP LOCKED
    ), picked AS (
        SELECT id FROM fair UNION ALL SELECT id FROM untagged
    ), claimed AS (
        UPDATE queueworker.tasks_active t
        SET state = 'running', attempts = t.attempts + 1, lease_owner = $3,
            lease_token = t.lease_token + 1, fair_tag = -coalesce(t.fair_tag, 1),
            leased_until = statement_timestamp() + make_interval(secs => $4),
            deadline_at = statement_timestamp() + make_interval(secs => coalesce(t.timeout_seconds, $5)),
            started_at = statement_timestamp(), updated_at = statement_timestamp()
        WHERE t.id = ANY(ARRAY(SELECT id FROM picked)) AND t.state = 'pending'
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
        SELECT id, 'pending', 'running', $3, lease_token, jsonb_build_object('attempts', attempts)
        FROM claimed
    )
    SELECT id, queue, task, payload_json, attempts, max_attempts, lease_token, seconds_to_deadline, run_json,
           checkpoint_json, headers_json, key
    FROM claimed;
END
$$;

REVOKE EXECUTE ON FUNCTION queueworker.claim_tasks(text, integer, uuid, float8, float8, boolean),
                           queueworker.claim_fair_tasks(text, integer, uuid, float8, float8, boolean) FROM PUBLIC;
