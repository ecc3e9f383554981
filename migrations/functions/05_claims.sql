-- queueworker functions: the plain claims' look at a row as it is now (worker/db/lease.sql, `claim`
-- and `claim_fair`).
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE: CREATE OR REPLACE TRIGGER cannot
-- replace a constraint trigger). A SQL-language body is checked when it is created: what it calls
-- must come from an earlier file, or from earlier in the same one. PL/pgSQL bodies are resolved
-- when they run.

-- A plain claim (`claim`, `claim_fair`) reads the line from a snapshot taken when it starts; a row
-- another claim took after that still looks pending to it, and `FOR NO KEY UPDATE SKIP LOCKED` then
-- locks the row's newest version (running), finds it no longer matches, passes it over, and keeps
-- the lock until it commits: the completion of that task, on another worker, waits for this
-- unrelated claim. Among many worker processes on few cores these waits were most of the database's
-- lock waits (BENCHMARKS.md, "Fleets"). So before it locks a row whose `xmax` shows a change since the
-- row was written, a claim asks `ended_before_snapshot`, then, only if the change may be later
-- than its snapshot, `still_pending`. What they answer only narrows the claim's choice: the lock
-- and the claim's own `state = 'pending'` recheck decide, as before, so a wrong answer costs a
-- wait or a turn, never a task. Both are SECURITY INVOKER and read with the caller's rights (which
-- hold the claim's own), and so are free to run with the caller's search_path: their names are
-- qualified.

-- Whether the transaction `x` (a row's `xmax`) had ended when the calling statement's snapshot was
-- taken. A row version the snapshot shows, whose `xmax` ended before it, was only locked by `x`
-- (an update that ended before would hide the version), so it has not changed since. Most
-- claimable rows that have an `xmax` are like this: a lock carried over to the version its
-- locker wrote (a retry or a delayed task made due by `promote_due`, a rescue, a release). The
-- 32-bit `x` takes the epoch of the snapshot's next transaction id (the one before when `x` is
-- larger: it wrapped since). An `xmax` that is a MultiXactId (several lockers) gives an answer
-- that means nothing, which is harmless (above). A single SELECT without FROM: the planner
-- inlines it, and it costs an expression, not a call.
CREATE OR REPLACE FUNCTION queueworker.ended_before_snapshot(x xid) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.pg_visible_in_snapshot(
        ((pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint >> 32 << 32)
         + x::text::bigint
         - CASE WHEN x::text::bigint
                     > (pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint & 4294967295)
                THEN 4294967296 ELSE 0 END)::text::xid8,
        pg_catalog.pg_current_snapshot())
$$;

-- Whether a task is pending now, as the last committed change left it, rather than as the calling
-- statement's snapshot shows it: a VOLATILE SQL function takes a new snapshot for its query in
-- READ COMMITTED. False for a row another claim took after the caller's snapshot.
CREATE OR REPLACE FUNCTION queueworker.still_pending(task_id bigint) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT EXISTS (SELECT FROM queueworker.tasks_active t WHERE t.id = task_id AND t.state = 'pending')
$$;
