"""Every SQL statement queueworker runs, named in one place.

Statements use psycopg named placeholders. Each transition out of `running` is fenced:
it matches `(id, lease_token, state = 'running')`, so a worker that lost its lease
(expired, rescued, re-claimed, cancelled) changes nothing. Statements whose rows are read by
name return a row type defined next to them (see `DutyConnection.fetch(..., row=...)`).
"""

from datetime import datetime
from typing import Any, NamedTuple

NOTIFY_CHANNEL = "queueworker"
# A listener's check that notifications reach it at all (worker/listener.py): to its own channel.
NOTIFY_CHECK = "SELECT pg_notify(%(channel)s, '')"

# Advisory lock keys (arbitrary constants inside our own namespace of keys).
MIGRATION_LOCK_KEY = 0x71770001
RESCUER_LOCK_KEY = 0x71770002
SCHEDULER_LOCK_KEY = 0x71770003
CLEANER_LOCK_KEY = 0x71770004

# -- migrations ---------------------------------------------------------------------------

# The schema is created only when missing: `CREATE SCHEMA IF NOT EXISTS` needs CREATE on the
# database even when the schema exists, which a migrator role that owns only the schema lacks
# (docs/database-roles.sql creates the schema for it). `schema_migrations` records the versioned
# migrations applied; `schema_functions` the function files (migrations/functions/) as last applied.
CREATE_MIGRATIONS_TABLE = """
DO $$
BEGIN
    IF to_regnamespace('queueworker') IS NULL THEN
        CREATE SCHEMA queueworker;
    END IF;
END
$$;
CREATE TABLE IF NOT EXISTS queueworker.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS queueworker.schema_functions (
    name       text PRIMARY KEY,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""

# Taken, if free, by a transaction of its own that holds it for a whole migrate run (its commit or
# rollback ends it, so a transaction pooler never keeps it behind): idle between statements, and
# not to be ended for it.
TRY_LOCK_MIGRATIONS = """
SELECT pg_try_advisory_xact_lock(%(key)s), set_config('idle_in_transaction_session_timeout', '0', true)
"""
# SET LOCAL, with a parameter: how long a migration's statements wait for a lock before giving up.
SET_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %(lock_timeout)s, true)"
# Other sessions holding locks on queueworker's tables, oldest transaction first: who a migration
# that timed out waiting for a lock was most likely waiting for.
LOCK_HOLDERS = """
SELECT a.pid, a.usename::text AS user_name, a.application_name, a.state,
       extract(epoch FROM now() - a.xact_start)::float8 AS transaction_seconds,
       string_agg(DISTINCT l.mode || ' on ' || l.relation::regclass::text, ', ') AS locks
FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.granted AND l.locktype = 'relation' AND l.pid <> pg_backend_pid()
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.relation IN (SELECT oid FROM pg_class WHERE relnamespace = to_regnamespace('queueworker'))
GROUP BY a.pid, a.usename, a.application_name, a.state, a.xact_start
ORDER BY a.xact_start NULLS LAST
LIMIT %(limit)s
"""
APPLIED_MIGRATIONS = "SELECT version, name, checksum FROM queueworker.schema_migrations ORDER BY version"
RECORD_MIGRATION = """
INSERT INTO queueworker.schema_migrations (version, name, checksum)
VALUES (%(version)s, %(name)s, %(checksum)s)
"""
# A migration rewritten since it was applied, whose recorded checksum is a known earlier text's.
UPDATE_MIGRATION_CHECKSUM = """
UPDATE queueworker.schema_migrations SET checksum = %(checksum)s
WHERE version = %(version)s AND checksum = %(superseded)s
"""
APPLIED_FUNCTIONS = "SELECT name, checksum FROM queueworker.schema_functions ORDER BY name"
# In the transaction of every versioned migration: the function files must be applied again after
# it, even if this run stops before they are (a versioned migration may drop what they define).
FORGET_FUNCTIONS = "DELETE FROM queueworker.schema_functions"
# After the function files were applied: exactly the files shipped, with their checksums.
RECORD_FUNCTIONS = """
WITH gone AS (
    DELETE FROM queueworker.schema_functions WHERE name <> ALL(%(names)s::text[])
)
INSERT INTO queueworker.schema_functions (name, checksum)
SELECT * FROM unnest(%(names)s::text[], %(checksums)s::text[])
ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now()
"""
SCHEMA_VERSION = """
SELECT coalesce(max(version), 0)
FROM queueworker.schema_migrations
"""
SCHEMA_EXISTS = "SELECT to_regclass('queueworker.schema_migrations') IS NOT NULL"

# -- producer -------------------------------------------------------------------------------

# One statement for any batch size. Wakes idle workers with one NOTIFY per queue per statement
# (delivered at commit, so it rides the caller's transaction); a batch that is only due later
# carries its due time so listeners can schedule a precise wake-up instead of polling. The NOTIFY
# is spelled out rather than calling queueworker.wake_queue (migration 004), so that plain enqueues
# keep working against a schema not yet migrated that far; for the same reason a batch without
# headers (migration 012) is inserted by ENQUEUE, one with them by ENQUEUE_WITH_HEADERS.
# `source` is where the specs come from: the statement's arrays, or the staging table that a COPY
# filled (enqueue_staged); `spec_hash` computes the spec hash in the statement (the row trigger of
# migration 004 then skips the row), which costs the database less than a trigger call per row.
def _enqueue(headers: bool, source: str, spec_hash: bool = False) -> str:
    columns = ", headers" if headers else ""
    values = ", s.headers" if headers else ""
    if spec_hash:
        columns += ", spec_hash"
        values += ", queueworker.spec_hash(s.queue, s.task, s.payload)"
    return """
WITH inserted AS (
    INSERT INTO queueworker.tasks (queue, task, payload, priority, run_after, delayed, max_attempts, timeout_seconds""" \
        + columns + """)
    SELECT s.queue, s.task, s.payload, s.priority, coalesce(s.run_after, now()), coalesce(s.run_after > now(), false),
           s.max_attempts, s.timeout_seconds""" + values + """
    FROM """ + source + """
    ORDER BY s.ord
    RETURNING id, queue, run_after
), notified AS (
    SELECT pg_notify('queueworker',
                     CASE WHEN min(run_after) <= now() THEN queue
                          ELSE queue || ' ' || extract(epoch FROM min(run_after))::text END)
    FROM inserted GROUP BY queue
)
SELECT id, (SELECT count(*) FROM notified) AS notified FROM inserted ORDER BY id
"""


def _arrays(headers: bool) -> str:
    array, name = (", %(headers)s::jsonb[]", " headers,") if headers else ("", "")
    return """unnest(%(queues)s::text[], %(tasks)s::text[], %(payloads)s::jsonb[], %(priorities)s::int[],
                %(run_afters)s::timestamptz[], %(max_attempts)s::int[], %(timeouts)s::int[]""" + array + """)
         WITH ORDINALITY AS s(queue, task, payload, priority, run_after, max_attempts, timeout_seconds,""" + name \
        + """ ord)"""


ENQUEUE = _enqueue(headers=False, source=_arrays(headers=False))
ENQUEUE_WITH_HEADERS = _enqueue(headers=True, source=_arrays(headers=True))

# The fast path of a big batch of plain specs (producer.COPY_THRESHOLD): COPY into a temporary
# staging table, then enqueue_staged(), which inserts them in one statement, as ENQUEUE does with
# arrays. Sending the rows costs the client a fraction of what binding them as array parameters
# does, and the server parses them while the client is still sending. The table is dropped when
# the transaction ends, and emptied before each batch that reuses it within one transaction.
STAGING_TABLE = "pg_temp.queueworker_staged_tasks"
# Whether this transaction has a staging table already, whether the role may create one (TEMPORARY
# on the database, granted to PUBLIC unless revoked), and whether the statement may set the spec
# hash itself: the schema has it (migration 004) and the role may insert it (the owner; a
# least-privilege producer may not, so that it cannot forge one, and its rows get theirs from the
# trigger).
STAGING_STATE = f"""
SELECT to_regclass('{STAGING_TABLE}') IS NOT NULL AS exists,
       has_database_privilege(current_database(), 'TEMPORARY') AS allowed,
       CASE WHEN EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'queueworker.tasks'::regclass
                                                    AND attname = 'spec_hash' AND NOT attisdropped)
            THEN has_column_privilege('queueworker.tasks', 'spec_hash', 'INSERT') ELSE false END AS spec_hash
"""


class StagingStateRow(NamedTuple):
    exists: bool
    allowed: bool
    spec_hash: bool


# The columns ENQUEUE takes, typed as the table's, so the COPY parses payloads and headers once.
CREATE_STAGING = """
CREATE TEMPORARY TABLE queueworker_staged_tasks (
    ord bigint NOT NULL, queue text NOT NULL, task text NOT NULL, payload jsonb NOT NULL, priority integer NOT NULL,
    run_after timestamptz, max_attempts integer NOT NULL, timeout_seconds integer, headers jsonb
) ON COMMIT DROP
"""
EMPTY_STAGING = f"TRUNCATE {STAGING_TABLE}"
# Text format (producer.Copy says why).
COPY_STAGING = f"""
COPY {STAGING_TABLE} (ord, queue, task, payload, priority, run_after, max_attempts, timeout_seconds, headers)
FROM STDIN
"""


def enqueue_staged(headers: bool, spec_hash: bool) -> str:
    """ENQUEUE from the staging table that COPY_STAGING filled."""
    return _enqueue(headers, f"{STAGING_TABLE} s", spec_hash)


class EnqueuedRow(NamedTuple):
    id: int
    notified: int


# Everything beyond a plain task: dedupe keys (TaskSpec.dedupe_key, or dedupe="spec": the hex spec
# hash as the key) and prerequisites (TaskSpec.depends_on: the task starts `blocked`), through a
# definer function (migrations 004 and 006) that inserts into `tasks_active`, whose unique index is
# the ON CONFLICT arbiter, records the edges and wakes the queues: the producer role needs no right
# on the partition or the edges. DO NOTHING, not DO UPDATE: a duplicate takes no lock on the existing
# task, so a producer's open transaction never holds up the worker that runs it. One row per spec,
# in order: its key, and its new id, or NULL when a task held the key already (a duplicate within
# the batch gets the id of the first spec with its key). `prerequisite_ords[i]` is the 1-based
# position of the spec that depends on task `prerequisite_ids[i]`; `run_ids` and `run_partitions`
# place partitions in their run (migration 006).
ENQUEUE_TASKS = """
SELECT ord, queue, dedupe_key, id, notified
FROM queueworker.enqueue_tasks(%(queues)s::text[], %(tasks)s::text[], %(payloads)s::jsonb[], %(priorities)s::int[],
                               %(run_afters)s::timestamptz[], %(max_attempts)s::int[], %(timeouts)s::int[],
                               %(dedupe_keys)s::text[], %(by_spec)s::bool[], %(cancel_on_failure)s::bool[],
                               %(prerequisite_ords)s::bigint[], %(prerequisite_ids)s::bigint[],
                               %(run_ids)s::bigint[], %(run_partitions)s::int[])
"""
# The same with each spec's headers, for batches that have some (as ENQUEUE_WITH_HEADERS).
ENQUEUE_TASKS_WITH_HEADERS = ENQUEUE_TASKS.replace("%(run_partitions)s::int[])",
                                                   "%(run_partitions)s::int[], %(headers)s::jsonb[])")


class TaskEnqueuedRow(NamedTuple):
    ord: int
    queue: str
    dedupe_key: str | None
    id: int | None
    notified: int


# The task holding each key, for the specs ENQUEUE_UNIQUE did not insert: the unfinished one, else
# (it finished since) the newest finished one. A new statement, so it sees the duplicate that the
# insert waited for.
ENQUEUE_EXISTING = """
SELECT k.ord, t.id, t.state::text AS state
FROM unnest(%(ords)s::bigint[], %(queues)s::text[], %(dedupe_keys)s::text[]) AS k(ord, queue, dedupe_key)
CROSS JOIN LATERAL (
    SELECT id, state FROM queueworker.tasks
    WHERE queue = k.queue AND dedupe_key = k.dedupe_key
    ORDER BY state IN ('succeeded', 'failed', 'cancelled'), id DESC
    LIMIT 1
) t
ORDER BY k.ord
"""


class ExistingTaskRow(NamedTuple):
    ord: int
    id: int
    state: str


# on_conflict="replace": a duplicate that is still `pending` takes the new spec's payload, priority
# and schedule (the last spec wins within a batch), through a definer function (migration 004) that
# changes only pending tasks with a dedupe key. It updates through the parent, so the update trigger
# audits it (`pending -> pending`, detail `replaced`); only rows that really change are touched. A
# spec due now keeps a due task's place in line, and makes a delayed one due now.
ENQUEUE_REPLACE = """
SELECT id, notified
FROM queueworker.replace_pending(%(ids)s::bigint[], %(payloads)s::jsonb[], %(priorities)s::int[],
                                 %(run_afters)s::timestamptz[])
"""


class ReplacedRow(NamedTuple):
    id: int
    notified: int


# -- worker: claim, heartbeat, complete, release ---------------------------------------------

# The CTE is MATERIALIZED so the planner cannot turn the LIMIT into a nested loop that
# updates more rows than asked for; NO KEY UPDATE does not block foreign keys to tasks.
# Aimed at the `tasks_active` partition (no routing through the parent), so it writes its own
# audit rows, which costs less than the parent's transition-table trigger.
def _claim(head: str, guard: str, chosen: str, tail: str) -> str:
    """The claim statement: `head` CTEs before `picked`, a `guard` condition on whether to pick at
    all (an InitPlan: the LIMIT stays a plain parameter, so the planner keeps the index scan), a
    `chosen` CTE narrowing what was picked (or none), `tail` CTEs after `audited`. For CLAIM and
    CLAIM_LIMITED."""
    source = "chosen" if chosen else "picked"
    return "WITH " + head + """picked AS MATERIALIZED (
    SELECT id, priority, run_after FROM queueworker.tasks_active
    WHERE state = 'pending' AND NOT delayed AND queue = %(queue)s AND run_after <= now()""" + guard + """
    ORDER BY priority DESC, run_after, id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
)""" + chosen + """, claimed AS (
    UPDATE queueworker.tasks_active t
    SET state = 'running', attempts = t.attempts + 1, lease_owner = %(worker)s,
        lease_token = t.lease_token + 1,
        leased_until = now() + make_interval(secs => %(lease_seconds)s),
        deadline_at = now() + make_interval(secs => coalesce(t.timeout_seconds, %(timeout_seconds)s)),
        started_at = now(), updated_at = now()
    FROM """ + source + """ picked
    WHERE t.id = picked.id AND t.state = 'pending'
    RETURNING t.id, t.queue, t.task, t.payload::text AS payload_json, t.attempts, t.max_attempts, t.lease_token,
              extract(epoch FROM t.deadline_at - now())::float8 AS seconds_to_deadline,
              CASE WHEN t.run_id IS NOT NULL THEN (
                  SELECT jsonb_build_object('id', r.id, 'name', r.name, 'partition', t.run_partition,
                                            'watermark', r.watermark, 'watermark_before', r.watermark_before,
                                            'forced', r.forced)::text
                  FROM queueworker.runs r WHERE r.id = t.run_id) END AS run_json,
              t.checkpoint::text AS checkpoint_json, t.headers::text AS headers_json
), audited AS (
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT id, 'pending', 'running', %(worker)s, lease_token, jsonb_build_object('attempts', attempts)
    FROM claimed
)""" + tail + """
SELECT id, queue, task, payload_json, attempts, max_attempts, lease_token, seconds_to_deadline, run_json,
       checkpoint_json, headers_json
FROM claimed
"""


# A queue with flow control (a row in queueworker.queues that sets something: migration 009) is
# claimed by CLAIM_LIMITED only: here its limit is 0, an index probe of a tiny table per statement.
CLAIM = _claim("", """
      AND NOT EXISTS (SELECT FROM queueworker.queues l WHERE l.name = %(queue)s AND l.limited)""", "", "")

# Locks a flow-controlled queue's row in the claim's transaction before CLAIM_LIMITED runs. It must
# be a statement of its own: in READ COMMITTED a statement reads from a snapshot taken when it
# starts, so a claim that waited for the row inside its own statement would count the running tasks
# as they were before the claim it waited for (two claimers would each fill the whole cap).
LOCK_QUEUE = "SELECT FROM queueworker.queues WHERE name = %(queue)s FOR NO KEY UPDATE"

# A queue with flow control, after LOCK_QUEUE. Its row is locked, so concurrent claimers take turns
# and every limit holds exactly: nothing while paused or while the breaker is open; one probe task once the
# breaker's cooldown has passed (the breaker goes half-open; a probe lost without an outcome lets
# another one through after the cooldown); no more than the token bucket holds (refilled at
# `rate_per_second`, at most `burst`), and no more than `max_running` minus the queue's running
# tasks. The bucket is charged for what was claimed. A queue whose row went away meanwhile is
# claimed up to the limit, as the plain claim would.
CLAIM_LIMITED = _claim("""settings AS MATERIALIZED (
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
), """, """
      AND coalesce((SELECT n FROM allowance), 1) > 0""", """, chosen AS (
    SELECT id FROM picked ORDER BY priority DESC, run_after, id
    LIMIT coalesce((SELECT n FROM allowance), %(limit)s)
)""", """, charged AS (
    UPDATE queueworker.queues q
    SET tokens = coalesce(a.level - (SELECT count(*) FROM claimed), q.tokens), tokens_at = now(),
        breaker_state = CASE WHEN a.breaker_state <> 'closed' AND EXISTS (SELECT FROM claimed)
                             THEN 'half_open' ELSE q.breaker_state END,
        breaker_changed_at = CASE WHEN a.breaker_state <> 'closed' AND EXISTS (SELECT FROM claimed)
                                  THEN now() ELSE q.breaker_changed_at END
    FROM allowance a WHERE q.name = a.name
)""")


class ClaimedRow(NamedTuple):
    """A task a claim just leased. The payload stays JSON text here: each attempt decodes its own,
    so a row Python cannot read (nested 2,000 deep, a 5,000-digit number) fails only that task."""

    id: int
    queue: str
    task: str
    payload_json: str
    attempts: int
    max_attempts: int
    lease_token: int
    seconds_to_deadline: float
    run_json: str | None  # the run a partition, consolidation or alert belongs to (RunInfo); else None
    checkpoint_json: str | None  # what an earlier attempt saved with ctx.save_checkpoint
    headers_json: str | None  # the producer's headers (trace context), read by queueworker.tracing

# Registers a worker (its `workers` row), or refreshes the row of one already registered.
REGISTER_WORKER = """
    INSERT INTO queueworker.workers
        (id, hostname, pod_name, pod_namespace, pid, queues, concurrency, running, draining, version)
    VALUES (%(worker)s, %(hostname)s, %(pod_name)s, %(pod_namespace)s, %(pid)s, %(queues)s,
            %(concurrency)s, %(running)s, %(draining)s, %(version)s)
    ON CONFLICT (id) DO UPDATE
    SET heartbeat_at = now(), running = EXCLUDED.running, draining = EXCLUDED.draining
"""

# Extends the leases this worker still holds and refreshes its `workers` row, in one statement.
# Leases past their hard deadline are not extended, but still reported as held: the attempt's own
# deadline ends it and reports DeadlineExceeded.
HEARTBEAT = """
WITH me AS (""" + REGISTER_WORKER + """)
UPDATE queueworker.tasks t
SET leased_until = CASE WHEN t.deadline_at > now() THEN now() + make_interval(secs => %(lease_seconds)s)
                        ELSE t.leased_until END,
    progress = coalesce(h.progress, t.progress)
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(progresses)s::jsonb[]) AS h(id, token, progress)
WHERE t.id = h.id AND t.lease_token = h.token AND t.state = 'running'
RETURNING t.id, t.lease_token, t.deadline_at > now() AS extended
"""

# `ctx.save_checkpoint`: fenced by the lease like every write of an attempt, and aimed at the
# active partition (its row is there while it runs), so no audit trigger runs for a change that
# is not a transition. The latest progress goes along.
SAVE_CHECKPOINT = """
UPDATE queueworker.tasks_active
SET checkpoint = %(checkpoint)s::jsonb, progress = coalesce(%(progress)s::jsonb, progress), updated_at = now()
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
RETURNING id, lease_token
"""


class HeldRow(NamedTuple):
    """A lease the heartbeat found still held, and whether it was extended (not past its deadline:
    the worker's own deadline then cancels the attempt and reports it)."""

    id: int
    lease_token: int
    extended: bool

DEREGISTER_WORKER = "DELETE FROM queueworker.workers WHERE id = %(worker)s"

# Where `wait_for` hears that a task it waits for has finished (payload: the task's id).
FINISHED_CHANNEL = "queueworker_finished"

# Moves the rows from `tasks_active` to `tasks_finished` itself and writes their audit rows, in
# one statement: as cheap as an in-place UPDATE, where an UPDATE routed through the partitioned
# parent costs Postgres 15 about twice as much per row. DML aimed at a partition does not fire
# the parent's audit triggers, hence the explicit `audited` step (as in CLAIM), and the explicit
# `settled` step: the tasks waiting on these become pending in this same statement (migration 006;
# one advisory lock and one index probe when nothing waits), and the `counted` step: the runs these
# belong to count them (migration 006; nothing to do for tasks of no run). Lists every column of
# queueworker.tasks: keep it in step with the migrations.
def _complete_succeeded(inputs: str, carried: str, steps: str) -> str:
    """The success statement, for plain successes and for continuations: `inputs` are the unnest
    columns after (id, token, result), `carried` what `done` returns besides the row, `steps` the
    CTEs after `settled`."""
    return """
WITH done AS (
    DELETE FROM queueworker.tasks_active t
    USING unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(results)s::jsonb[]""" + inputs + """
    WHERE t.id = c.id AND t.lease_token = c.token AND t.state = 'running'
    RETURNING t.id, t.queue, t.task, t.delayed, t.priority, t.run_after, t.attempts, t.max_attempts,
              t.rescues, t.timeout_seconds, t.payload, c.result, t.error, t.lease_owner, t.lease_token,
              t.created_at, t.started_at, t.spec_hash, t.dedupe_key, t.run_id, t.run_partition, t.progress,
              t.continued_from, t.notify_on_finish, t.headers""" + carried + """
), moved AS (
    INSERT INTO queueworker.tasks_finished
        (id, queue, task, state, delayed, priority, run_after, attempts, max_attempts, rescues, timeout_seconds,
         payload, result, error, lease_owner, lease_token, leased_until, deadline_at, created_at, updated_at,
         started_at, finished_at, spec_hash, dedupe_key, run_id, run_partition, progress, continued_from,
         notify_on_finish, headers)
    OVERRIDING SYSTEM VALUE
    SELECT id, queue, task, 'succeeded', delayed, priority, run_after, attempts, max_attempts, rescues,
           timeout_seconds, payload, result, NULL, lease_owner, lease_token, NULL, NULL, created_at, now(),
           started_at, now(), spec_hash, dedupe_key, run_id, run_partition, progress, continued_from,
           notify_on_finish, headers
    FROM done
    RETURNING id, lease_token
), audited AS (
    INSERT INTO queueworker.task_events (task_id, from_state, to_state, worker, lease_token, detail)
    SELECT id, 'running', 'succeeded', lease_owner, lease_token, queueworker.transition_detail(attempts, NULL, error)
    FROM done
), settled AS (
    SELECT queueworker.settle_dependents(array_agg(id), array_agg(id)) FROM moved
), announced AS (
    SELECT pg_notify('""" + FINISHED_CHANNEL + """', id::text) FROM done WHERE notify_on_finish
)""" + steps


COMPLETE_SUCCEEDED = _complete_succeeded(") AS c(id, token, result)", "", """, counted AS (
    SELECT queueworker.count_run_outcomes(array_agg(id), array_agg(run_id), array_agg(run_partition),
                                          array_agg('running'::text), array_agg('succeeded'::text))
    FROM done WHERE run_id IS NOT NULL HAVING count(*) > 0
)
SELECT id, lease_token FROM moved LEFT JOIN counted ON true, settled, (SELECT count(*) FROM announced) AS a
""")

# A handler returned Continue(payload, delay): the task succeeds and its next page is enqueued in
# the same statement (same task, queue, priority, attempts allowed, timeout and run partition;
# `continued_from` links them; its headers are the attempt's trace context when tracing, else the
# task's own), so there is never one without the other. A page of a run's partition
# is not the partition's outcome: the last page's is, so this statement counts nothing.
COMPLETE_CONTINUED = _complete_succeeded(""",
                %(next_payloads)s::jsonb[], %(next_delays)s::float8[], %(next_headers)s::jsonb[])
         AS c(id, token, result, next_payload, next_delay, next_headers)""",
    ", c.next_payload, c.next_delay, c.next_headers", """, followed AS (
    INSERT INTO queueworker.tasks (queue, task, payload, priority, run_after, delayed, max_attempts,
                                   timeout_seconds, run_id, run_partition, continued_from, headers)
    SELECT d.queue, d.task, d.next_payload, d.priority, now() + make_interval(secs => d.next_delay),
           d.next_delay > 0, d.max_attempts, d.timeout_seconds, d.run_id, d.run_partition, d.id,
           coalesce(d.next_headers, d.headers)
    FROM done d JOIN moved m ON m.id = d.id
    RETURNING id, queue, run_after
), woken AS (
    SELECT queueworker.wake_queue(queue, min(run_after)) FROM followed GROUP BY queue
)
SELECT m.id, m.lease_token FROM moved m, settled, (SELECT count(*) FROM woken) AS w,
       (SELECT count(*) FROM announced) AS a
""")

# A retryable failure with attempts left waits out its backoff in `retrying`; anything else fails.
COMPLETE_FAILED = """
UPDATE queueworker.tasks t
SET state = CASE WHEN c.retryable AND t.attempts < t.max_attempts
                 THEN 'retrying' ELSE 'failed' END::queueworker.task_state,
    run_after = CASE WHEN c.retryable AND t.attempts < t.max_attempts
                     THEN now() + make_interval(secs => c.backoff_seconds) ELSE t.run_after END,
    finished_at = CASE WHEN c.retryable AND t.attempts < t.max_attempts THEN NULL ELSE now() END,
    error = c.error, updated_at = now(), leased_until = NULL, deadline_at = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(retryables)s::bool[],
            %(backoffs)s::float8[], %(errors)s::jsonb[]) AS c(id, token, retryable, backoff_seconds, error)
WHERE t.id = c.id AND t.lease_token = c.token AND t.state = 'running'
RETURNING t.id, t.lease_token, t.state::text AS state
"""


class FencedRow(NamedTuple):
    """A row a fenced statement changed: which attempt of which task."""

    id: int
    lease_token: int


class FailedRow(NamedTuple):
    """A failed attempt as recorded: `retrying` (backoff) or `failed`."""

    id: int
    lease_token: int
    state: str

# Graceful shutdown, once every outcome is flushed: hands back to `pending`, without consuming the
# attempt, every task the database says this worker still holds, whatever the worker remembers
# (attempts cut short by the drain, attempts it cancelled when their lease ran out by its own clock,
# a claim whose answer never arrived), and wakes other workers. The task's error (and so its audit
# row) says it was interrupted by a drain; queueworker_tasks_released_total counts them.
RELEASE = """
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
SELECT id, queue, (SELECT count(*) FROM notified) AS notified FROM released
"""


class ReleasedRow(NamedTuple):
    id: int
    queue: str
    notified: int


# Hands tasks back to `pending` without consuming their attempt, due again after a delay: a
# handler that snoozes (`raise Snooze(seconds)`, waiting on something outside), and a worker that
# has no handler for a task's name, while the task is younger than the grace period (a newer worker
# may have one: rolling deploys). The error says which, and the audit row shows it. Rows not
# returned are stale, or too old for their grace.
HAND_BACK = """
UPDATE queueworker.tasks t
SET state = 'pending', delayed = true, attempts = greatest(t.attempts - 1, 0),
    run_after = now() + make_interval(secs => d.delay_seconds), error = d.error, updated_at = now(),
    lease_owner = NULL, leased_until = NULL, deadline_at = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(delays)s::float8[], %(errors)s::jsonb[],
            %(graces)s::float8[]) AS d(id, token, delay_seconds, error, grace_seconds)
WHERE t.id = d.id AND t.lease_token = d.token AND t.state = 'running'
  AND (d.grace_seconds IS NULL OR t.created_at > now() - make_interval(secs => d.grace_seconds))
RETURNING t.id, t.lease_token
"""

# -- background duties -----------------------------------------------------------------------

# Rescuer: returns tasks whose lease expired (or whose hard deadline passed long ago) to the
# queue, or fails them when their attempts are spent, and forgets workers that stopped
# heartbeating. Guarded by a transaction-scoped advisory lock so one worker does it at a time.
RESCUE = """
WITH guard AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock(%(lock_key)s) AS held
), expired AS (
    SELECT t.id FROM queueworker.tasks t, guard
    WHERE guard.held AND t.state = 'running'
      AND (t.leased_until < now() OR t.deadline_at < now() - make_interval(secs => %(deadline_grace)s))
    ORDER BY t.id
    LIMIT %(limit)s
    FOR NO KEY UPDATE OF t SKIP LOCKED
), rescued AS (
    UPDATE queueworker.tasks t
    SET state = CASE WHEN t.attempts >= t.max_attempts THEN 'failed' ELSE 'pending' END::queueworker.task_state,
        error = jsonb_build_object(
            'type', CASE WHEN t.leased_until < now() THEN 'LeaseExpired' ELSE 'DeadlineExceeded' END,
            'message', CASE WHEN t.leased_until < now()
                            THEN 'lease expired: worker ' || t.lease_owner::text || ' stopped heartbeating'
                            ELSE 'hard deadline exceeded while the worker still held the lease' END,
            'retryable', t.attempts < t.max_attempts),
        rescues = t.rescues + 1, run_after = now(), updated_at = now(),
        finished_at = CASE WHEN t.attempts >= t.max_attempts THEN now() END,
        lease_owner = NULL, leased_until = NULL, deadline_at = NULL
    FROM expired
    WHERE t.id = expired.id AND t.state = 'running'
    RETURNING t.id, t.queue, t.state
), reaped AS (
    DELETE FROM queueworker.workers w
    USING guard
    WHERE guard.held AND w.heartbeat_at < now() - make_interval(secs => %(worker_ttl)s)
    RETURNING w.id
), notified AS (
    SELECT pg_notify('queueworker', queue) FROM rescued WHERE state = 'pending' GROUP BY queue
)
SELECT (SELECT held FROM guard) AS held,
       (SELECT count(*) FROM rescued WHERE state = 'pending') AS requeued,
       (SELECT count(*) FROM rescued WHERE state = 'failed') AS failed,
       (SELECT count(*) FROM reaped) AS reaped,
       (SELECT count(*) FROM notified) AS notified
"""

# Scheduler: admits tasks whose time has come to the claim index (retrying -> pending when the
# backoff is over; delayed pending tasks when due), wakes their queues, and says when the next
# one is due so it can sleep exactly that long.
PROMOTE_DUE = """
WITH guard AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock(%(lock_key)s) AS held
), due AS (
    SELECT t.id FROM queueworker.tasks t, guard
    WHERE guard.held AND (t.state = 'retrying' OR (t.state = 'pending' AND t.delayed)) AND t.run_after <= now()
    ORDER BY t.run_after
    LIMIT %(limit)s
    FOR NO KEY UPDATE OF t SKIP LOCKED
), promoted AS (
    UPDATE queueworker.tasks t SET state = 'pending', delayed = false, updated_at = now()
    FROM due WHERE t.id = due.id AND t.state IN ('retrying', 'pending')
    RETURNING t.queue
), notified AS (
    SELECT pg_notify('queueworker', queue) FROM promoted GROUP BY queue
)
SELECT (SELECT count(*) FROM promoted) AS promoted,
       (SELECT count(*) FROM notified) AS notified,
       (SELECT extract(epoch FROM min(run_after) - now())::float8
        FROM queueworker.tasks WHERE state = 'retrying' OR (state = 'pending' AND delayed)) AS next_due_in
"""

# -- cron (migration 011, worker/cron.py) -------------------------------------------------------

DATABASE_NOW = "SELECT now()"

# Workers' cron duties look at the schedules again when told on this channel (payload: the
# schedule's name) by every statement that adds, changes, pauses, resumes or deletes one. Moving a
# schedule's next slot on (ENQUEUE_CRON_SLOTS) tells nobody: it only makes the schedule due later.
CRON_CHANNEL = "queueworker_cron"


def _telling_cron(change: str, result: str) -> str:
    """`change` (a statement on queueworker.cron_jobs returning `name` among its columns), followed
    by a notification to the cron duties for each schedule it changed; returns the `result`
    columns of what it returned."""
    return "WITH changed AS (" + change + """), told AS (
    SELECT pg_notify('""" + CRON_CHANNEL + """', name) FROM changed
)
SELECT """ + result + " FROM changed, (SELECT count(*) FROM told) AS t\n"


# A schedule written by `source`: created with its first slot, or changed in place; its next slot
# moves only when its expression or time zone changed (it is then the new first slot). A schedule
# of the other source is left alone, and so is one that would not change (no row comes back then).
_UPSERT_CRON_JOB = """
INSERT INTO queueworker.cron_jobs AS j (name, expression, timezone, task, payload, queue, priority, max_attempts,
                                       catch_up, source, next_slot)
VALUES (%(name)s, %(expression)s, %(timezone)s, %(task)s, %(payload)s::jsonb, %(queue)s, %(priority)s,
        %(max_attempts)s, %(catch_up)s, '{source}', %(first_slot)s)
ON CONFLICT (name) DO UPDATE
SET expression = excluded.expression, timezone = excluded.timezone, task = excluded.task, payload = excluded.payload,
    queue = excluded.queue, priority = excluded.priority, max_attempts = excluded.max_attempts,
    catch_up = excluded.catch_up, updated_at = now(),
    next_slot = CASE WHEN (j.expression, j.timezone) IS DISTINCT FROM (excluded.expression, excluded.timezone)
                     THEN excluded.next_slot ELSE j.next_slot END
WHERE j.source = '{source}'
  AND (j.expression, j.timezone, j.task, j.payload, j.queue, j.priority, j.max_attempts, j.catch_up)
      IS DISTINCT FROM (excluded.expression, excluded.timezone, excluded.task, excluded.payload, excluded.queue,
                        excluded.priority, excluded.max_attempts, excluded.catch_up)
RETURNING name, (xmax = 0) AS created
"""
UPSERT_CODE_CRON_JOB = _telling_cron(_UPSERT_CRON_JOB.replace("{source}", "code"), "created")
UPSERT_RUNTIME_CRON_JOB = _telling_cron(_UPSERT_CRON_JOB.replace("{source}", "runtime"), "created")
RUNTIME_CRON_JOBS_AMONG = """
SELECT name FROM queueworker.cron_jobs WHERE name = ANY(%(names)s::text[]) AND source = 'runtime' ORDER BY name
"""

# The schedules with a slot due within %(ahead)s seconds, and the database's clock, which every
# worker computes slots against (never its own).
DUE_CRON_JOBS = """
SELECT name, expression, timezone, catch_up, next_slot, now() AS now
FROM queueworker.cron_jobs
WHERE NOT paused AND next_slot <= now() + make_interval(secs => %(ahead)s)
ORDER BY next_slot
LIMIT %(limit)s
"""


class DueCronJobRow(NamedTuple):
    name: str
    expression: str
    timezone: str
    catch_up: str
    next_slot: datetime
    now: datetime


NEXT_CRON_SLOT_IN = """
SELECT extract(epoch FROM min(next_slot) - now())::float8 FROM queueworker.cron_jobs WHERE NOT paused
"""

# Enqueues a schedule's slots in the statement that moves its next slot on, and only if the
# schedule still is what the worker computed them from (compare-and-set on next_slot, expression
# and time zone): a second worker with the same slots waits for the first one's row lock, finds
# next_slot moved, and changes nothing. The task itself comes from the row as it is now. Each slot
# is one task due at the slot (a delayed one until then), with the key 'cron:NAME:<slot>',
# through queueworker.enqueue_tasks (migration 006), which also wakes the queue.
ENQUEUE_CRON_SLOTS = """
WITH advanced AS (
    UPDATE queueworker.cron_jobs
    SET next_slot = %(next_slot)s, last_enqueued_slot = coalesce(%(last_slot)s, last_enqueued_slot), updated_at = now()
    WHERE name = %(name)s AND next_slot = %(seen)s AND expression = %(expression)s AND timezone = %(timezone)s
      AND NOT paused
    RETURNING queue, task, payload, priority, max_attempts
), enqueued AS (
    SELECT e.id
    FROM advanced a, cardinality(%(slots)s::timestamptz[]) AS n,
         queueworker.enqueue_tasks(array_fill(a.queue, ARRAY[n]), array_fill(a.task, ARRAY[n]),
                                   array_fill(a.payload, ARRAY[n]), array_fill(a.priority, ARRAY[n]),
                                   %(slots)s::timestamptz[], array_fill(a.max_attempts, ARRAY[n]), '{}'::int[],
                                   %(dedupe_keys)s::text[], '{}'::bool[], '{}'::bool[], '{}'::bigint[],
                                   '{}'::bigint[], '{}'::bigint[], '{}'::int[]) AS e
    WHERE n > 0
)
SELECT (SELECT count(*) FROM advanced) AS advanced, (SELECT count(id) FROM enqueued) AS enqueued
"""

_CRON_JOB_COLUMNS = """name, expression, timezone, task, payload::text AS payload_json, queue, priority, max_attempts,
       catch_up, paused, source, next_slot, last_enqueued_slot, created_at, updated_at"""
CRON_JOBS = "SELECT " + _CRON_JOB_COLUMNS + " FROM queueworker.cron_jobs ORDER BY name"
# `cron resume` reads the schedule (locked: its next slot is computed from it) in its transaction.
CRON_SCHEDULE_FOR_UPDATE = """
SELECT expression, timezone, now() AS now FROM queueworker.cron_jobs WHERE name = %(name)s FOR UPDATE
"""


class CronJobRow(NamedTuple):
    name: str
    expression: str
    timezone: str
    task: str
    payload_json: str
    queue: str
    priority: int
    max_attempts: int
    catch_up: str
    paused: bool
    source: str
    next_slot: datetime
    last_enqueued_slot: datetime | None
    created_at: datetime
    updated_at: datetime


class CronScheduleRow(NamedTuple):
    expression: str
    timezone: str
    now: datetime


PAUSE_CRON_JOB = _telling_cron("""
UPDATE queueworker.cron_jobs SET paused = true, updated_at = now() WHERE name = %(name)s RETURNING name
""", "name")
# Resuming starts from the first slot after now: slots of the pause are not caught up.
RESUME_CRON_JOB = _telling_cron("""
UPDATE queueworker.cron_jobs SET paused = false, next_slot = %(next_slot)s, updated_at = now()
WHERE name = %(name)s AND paused RETURNING name
""", "name")
CRON_JOB_SOURCE = "SELECT source FROM queueworker.cron_jobs WHERE name = %(name)s"
DELETE_CRON_JOB = _telling_cron("""
DELETE FROM queueworker.cron_jobs WHERE name = %(name)s RETURNING name, source
""", "source")

# -- operators -------------------------------------------------------------------------------

# What a retry sets: pending and due now, with at least one more attempt.
_RETRY_SET = """SET state = 'pending', delayed = false, run_after = now(), updated_at = now(), finished_at = NULL,
    max_attempts = greatest(max_attempts, attempts + 1)"""
RETRY_TASK = """
UPDATE queueworker.tasks
""" + _RETRY_SET + """
WHERE id = %(id)s AND state IN ('failed', 'cancelled')
RETURNING id, queue, attempts, max_attempts
"""


class RetriedTaskRow(NamedTuple):
    id: int
    queue: str
    attempts: int
    max_attempts: int

# `queueworker.cancel` / `cancel_many` / `queueworker cancel`: the tasks given by id, or every task of
# a queue, in the given states. The error says who asked (the login) and why, so the audit row
# does too. The worker holding a running one hears of it at once (CANCEL_CHANNEL: "worker id
# lease token"), stops the handler and frees the slot; its heartbeat finds out too, should the
# notification be lost.
CANCEL_CHANNEL = "queueworker_cancel"
CANCEL_TASKS = """
WITH target AS (
    SELECT id, state, lease_owner, lease_token FROM queueworker.tasks
    WHERE (id = ANY(%(ids)s::bigint[]) OR (%(ids)s::bigint[] IS NULL AND queue = %(queue)s))
      AND state = ANY(%(states)s::queueworker.task_state[])
    ORDER BY id
    FOR UPDATE
), cancelled AS (
    UPDATE queueworker.tasks t
    SET state = 'cancelled', updated_at = now(), finished_at = now(),
        lease_owner = NULL, leased_until = NULL, deadline_at = NULL,
        error = jsonb_build_object('type', 'Cancelled', 'retryable', false,
                                   'message', %(reason)s || ' (by ' || session_user || ')')
    FROM target
    WHERE t.id = target.id AND t.state = target.state
    RETURNING t.id, target.state::text AS was, target.lease_owner, target.lease_token
), notified AS (
    SELECT pg_notify('""" + CANCEL_CHANNEL + """', lease_owner::text || ' ' || id || ' ' || lease_token)
    FROM cancelled WHERE was = 'running' AND lease_owner IS NOT NULL
)
SELECT id, was, (SELECT count(*) FROM notified) AS notified FROM cancelled ORDER BY id
"""


class CancelledRow(NamedTuple):
    id: int
    was: str        # the state it was cancelled from
    notified: int   # running tasks whose worker was told

# -- flow control (migration 009) -----------------------------------------------------------------

# Workers re-read their queues' settings when told on this channel (payload: the queue).
QUEUES_CHANNEL = "queueworker_queues"

# `paused_until` is 'infinity' for a pause until resumed, which Python cannot represent: NULL here.
_QUEUE_COLUMNS = """name, coalesce(paused_until > now(), false) AS paused,
       CASE WHEN isfinite(paused_until) THEN paused_until END AS paused_until, rate_per_second, burst, max_running,
       breaker_failures, breaker_cooldown_seconds, breaker_state, consecutive_failures, breaker_changed_at, limited"""


class QueueRow(NamedTuple):
    name: str
    paused: bool
    paused_until: Any  # None while paused until resumed
    rate_per_second: float | None
    burst: int | None
    max_running: int | None
    breaker_failures: int | None
    breaker_cooldown_seconds: float | None
    breaker_state: str
    consecutive_failures: int
    breaker_changed_at: Any
    limited: bool


def _change_queue(change: str) -> str:
    """A statement that applies `change` (an upsert of queueworker.queues returning the row as
    `changed`), tells the workers to re-read the queue's settings, and wakes them (at
    `wake_at`: now when the change may let tasks through sooner, or when a pause ends)."""
    return "WITH changed AS (\n" + change + "\n    RETURNING " + _QUEUE_COLUMNS + """
), told AS (
    SELECT pg_notify('""" + QUEUES_CHANNEL + """', name) FROM changed
), woken AS (
    SELECT queueworker.wake_queue(name, coalesce(%(wake_at)s::timestamptz, now())) FROM changed
    WHERE %(wake)s
)
SELECT """ + _QUEUE_COLUMNS + """ FROM changed, (SELECT count(*) FROM told) AS t, (SELECT count(*) FROM woken) AS w
"""


# Paused until `until` ('infinity': until resumed). Running tasks finish; the workers wake when it ends.
PAUSE_QUEUE = _change_queue("""    INSERT INTO queueworker.queues AS q (name, paused_until) VALUES (%(queue)s, %(until)s)
    ON CONFLICT (name) DO UPDATE SET paused_until = EXCLUDED.paused_until, updated_at = now()""")

RESUME_QUEUE = _change_queue("""    UPDATE queueworker.queues SET paused_until = NULL, updated_at = now()
    WHERE name = %(queue)s""")

# A rate limit (token bucket, full at first) and a global cap on running tasks; NULLs clear them.
LIMIT_QUEUE = _change_queue("""    INSERT INTO queueworker.queues AS q (name, rate_per_second, burst, tokens, max_running)
    VALUES (%(queue)s, %(rate)s, %(burst)s, coalesce(%(burst)s, 0), %(max_running)s)
    ON CONFLICT (name) DO UPDATE
    SET rate_per_second = EXCLUDED.rate_per_second, burst = EXCLUDED.burst, max_running = EXCLUDED.max_running,
        tokens = CASE WHEN q.rate_per_second IS NOT DISTINCT FROM EXCLUDED.rate_per_second
                       AND q.burst IS NOT DISTINCT FROM EXCLUDED.burst THEN q.tokens ELSE EXCLUDED.tokens END,
        tokens_at = CASE WHEN q.rate_per_second IS NOT DISTINCT FROM EXCLUDED.rate_per_second
                          AND q.burst IS NOT DISTINCT FROM EXCLUDED.burst THEN q.tokens_at ELSE now() END,
        updated_at = now()""")

# A circuit breaker (NULLs remove it); a new or changed one starts closed.
BREAKER_QUEUE = _change_queue("""    INSERT INTO queueworker.queues AS q (name, breaker_failures, breaker_cooldown_seconds)
    VALUES (%(queue)s, %(failures)s, %(cooldown)s)
    ON CONFLICT (name) DO UPDATE
    SET breaker_failures = EXCLUDED.breaker_failures, breaker_cooldown_seconds = EXCLUDED.breaker_cooldown_seconds,
        breaker_state = 'closed', consecutive_failures = 0, breaker_changed_at = NULL, updated_at = now()""")

QUEUE_SETTINGS = "SELECT " + _QUEUE_COLUMNS + """ FROM queueworker.queues
WHERE %(queue)s::text IS NULL OR name = %(queue)s ORDER BY name"""

# What a worker needs to choose its claim statement, for its own queues.
LIMITED_QUEUES = """
SELECT name, rate_per_second, breaker_failures IS NOT NULL AS has_breaker, breaker_state
FROM queueworker.queues WHERE name = ANY(%(queues)s::text[]) AND limited
"""


class LimitedQueueRow(NamedTuple):
    name: str
    rate_per_second: float | None
    has_breaker: bool
    breaker_state: str


# A worker's outcomes for a queue with a breaker, since its last report: whether any succeeded,
# and how many failed after the last success (or in all, when none did). The breaker opens at
# `breaker_failures` consecutive failures; a half-open breaker closes on a success and opens
# again on a failure. Returns the state before and after.
RECORD_BREAKER = """
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
RETURNING d.was, d.now_state
"""


class BreakerRow(NamedTuple):
    was: str
    now_state: str

# The queue's audit trail of settings and breaker states, newest first.
QUEUE_EVENTS = """
SELECT at, change, detail::text AS detail_json, by_user FROM queueworker.queue_events
WHERE queue = %(queue)s ORDER BY id DESC LIMIT %(limit)s
"""


class QueueEventRow(NamedTuple):
    at: Any
    change: str
    detail_json: str
    by_user: str


# Which of the leases a heartbeat found gone were cancelled (the worker stops those handlers with
# the reason "cancelled" rather than "lease lost").
CANCELLED_AMONG = """
SELECT id FROM queueworker.tasks
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'cancelled'
"""

# Marks tasks just enqueued (in the producer's transaction) to notify FINISHED_CHANNEL when they end.
NOTIFY_ON_FINISH = """
UPDATE queueworker.tasks SET notify_on_finish = true WHERE id = ANY(%(ids)s::bigint[]) AND NOT notify_on_finish
RETURNING id
"""


class MarkedRow(NamedTuple):
    id: int

# `queueworker list`: the newest tasks, by queue and state.
LIST_TASKS = """
SELECT id, queue, task, state::text AS state, attempts, max_attempts, progress::text AS progress_json,
       created_at, updated_at
FROM queueworker.tasks
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(state)s::text IS NULL OR state = %(state)s::queueworker.task_state)
ORDER BY id DESC LIMIT %(limit)s
"""


class ListedTaskRow(NamedTuple):
    id: int
    queue: str
    task: str
    state: str
    attempts: int
    max_attempts: int
    progress_json: str | None
    created_at: Any
    updated_at: Any


# `status --stuck`: running tasks whose lease has expired and that no rescuer has taken back yet
# (no live worker rescues, or the task is locked).
STUCK_TASKS = """
SELECT id, queue, task, lease_owner, extract(epoch FROM now() - leased_until)::float8 AS expired_for
FROM queueworker.tasks
WHERE state = 'running' AND leased_until < now() AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY leased_until LIMIT 1000
"""


class StuckTaskRow(NamedTuple):
    id: int
    queue: str
    task: str
    lease_owner: Any
    expired_for: float


TASK_STATES = "SELECT id, state::text AS state FROM queueworker.tasks WHERE id = ANY(%(ids)s::bigint[])"


class TaskStateRow(NamedTuple):
    id: int
    state: str

# One task, for `get_task` and `queueworker show`. JSON columns as text: they are user data, and
# the caller decides how to read them (Python may not read what another language stored).
TASK = """
SELECT id, queue, task, state::text AS state, attempts, max_attempts, priority, payload::text AS payload_json,
       result::text AS result_json, error::text AS error_json, progress::text AS progress_json,
       checkpoint::text AS checkpoint_json, dedupe_key, run_id, run_partition, continued_from,
       lease_owner, created_at, run_after, started_at, finished_at, updated_at
FROM queueworker.tasks WHERE id = %(id)s
"""


class TaskRow(NamedTuple):
    id: int
    queue: str
    task: str
    state: str
    attempts: int
    max_attempts: int
    priority: int
    payload_json: str
    result_json: str | None
    error_json: str | None
    progress_json: str | None
    checkpoint_json: str | None
    dedupe_key: str | None
    run_id: int | None
    run_partition: int | None
    continued_from: int | None
    lease_owner: Any
    created_at: Any
    run_after: Any
    started_at: Any
    finished_at: Any
    updated_at: Any


# A task's audit trail, oldest first.
TASK_EVENTS = """
SELECT at, from_state::text AS from_state, to_state::text AS to_state, worker, lease_token, detail::text AS detail_json
FROM queueworker.task_events WHERE task_id = %(id)s ORDER BY id
"""


class TaskEventRow(NamedTuple):
    at: Any
    from_state: str | None  # None: the task was enqueued
    to_state: str
    worker: Any
    lease_token: int
    detail_json: str | None

# -- runs ------------------------------------------------------------------------------------

START_RUN = """
SELECT queueworker.start_run(%(name)s, %(expected)s, %(on_success)s::jsonb, %(on_failure)s::jsonb,
                             %(watermark)s) AS id
"""


class StartedRunRow(NamedTuple):
    id: int


RUN_COLUMNS = """id, name, state::text AS state, expected, succeeded, failed, cancelled, success_task_id,
       failure_task_id, forced, watermark, watermark_before::text AS watermark_before_json,
       watermark_after::text AS watermark_after_json, started_at, finished_at"""
RUNS = "SELECT " + RUN_COLUMNS + """ FROM queueworker.runs
WHERE %(name)s::text IS NULL OR name = %(name)s ORDER BY id DESC LIMIT %(limit)s"""
RUN = "SELECT " + RUN_COLUMNS + " FROM queueworker.runs WHERE id = %(id)s"

# The run's tasks: partitions in order, then its consolidation and alert.
RUN_TASKS = """
SELECT id, run_partition AS partition, state::text AS state, attempts, error ->> 'message' AS error
FROM queueworker.tasks WHERE run_id = %(id)s ORDER BY run_partition NULLS LAST, id
"""


class RunTaskRow(NamedTuple):
    id: int
    partition: int | None
    state: str
    attempts: int
    error: str | None


# The run's audit trail (migration 007): one row per transition, oldest first.
RUN_EVENTS = """
SELECT at, from_state::text AS from_state, to_state::text AS to_state, detail::text AS detail_json, by_user
FROM queueworker.run_events WHERE run_id = %(id)s ORDER BY id
"""


class RunEventRow(NamedTuple):
    at: Any
    from_state: str | None  # None: the run was started
    to_state: str
    detail_json: str        # counters, consolidation and alert ids, forced: written by Postgres
    by_user: str


# `queueworker run retry ID`: the run's failed and cancelled partitions, as RETRY_TASK would.
RETRY_RUN = """
WITH retried AS (
    UPDATE queueworker.tasks
    """ + _RETRY_SET + """
    WHERE run_id = %(id)s AND run_partition IS NOT NULL AND state IN ('failed', 'cancelled')
    RETURNING id, queue
), notified AS (
    SELECT pg_notify('queueworker', queue) FROM retried GROUP BY queue
)
SELECT count(*) AS retried, (SELECT count(*) FROM notified) AS notified FROM retried
"""


class RetriedRunRow(NamedTuple):
    retried: int
    notified: int


FINALIZE_RUN = "SELECT queueworker.finalize_run(%(id)s) AS finalized"


class FinalizedRunRow(NamedTuple):
    finalized: bool


class RunRow(NamedTuple):
    id: int
    name: str
    state: str
    expected: int
    succeeded: int
    failed: int
    cancelled: int
    success_task_id: int | None
    failure_task_id: int | None
    forced: bool
    watermark: str | None
    # JSON text, decoded where it is shown: a watermark written by hand may be JSON Python cannot read
    watermark_before_json: str | None
    watermark_after_json: str | None
    started_at: Any
    finished_at: Any

# The unfinished task, other than this one, that holds this task's dedupe key: what keeps a finished
# task from being retried.
DEDUPE_HOLDER = """
SELECT h.id, h.state::text AS state, t.queue, t.dedupe_key
FROM queueworker.tasks t
JOIN queueworker.tasks_active h ON h.queue = t.queue AND h.dedupe_key = t.dedupe_key AND h.id <> t.id
WHERE t.id = %(id)s
"""


class DedupeHolderRow(NamedTuple):
    id: int
    state: str
    queue: str
    dedupe_key: str


NOTIFY_QUEUE = "SELECT pg_notify('queueworker', %(queue)s)"

# Counts per queue and state. Terminal states are counted too, which reads history: this is
# for humans (`queueworker status`), not for the controller's tick.
STATUS_COUNTS = """
SELECT queue, state::text, count(*) AS n
FROM queueworker.tasks
WHERE %(queue)s::text IS NULL OR queue = %(queue)s
GROUP BY queue, state
ORDER BY queue, state
"""

OLDEST_PENDING_AGE = """
SELECT queue, extract(epoch FROM now() - min(run_after))::float8 AS age
FROM queueworker.tasks
WHERE state = 'pending' AND NOT delayed AND (%(queue)s::text IS NULL OR queue = %(queue)s)
GROUP BY queue
"""

# `running` is counted from the leases held now (the partial index of running tasks), not the
# count the worker wrote at its last heartbeat, so it agrees with the queue counts beside it.
LIVE_WORKERS = """
SELECT w.id::text, w.hostname, w.pod_name, w.pod_namespace, w.pid, w.queues, w.concurrency,
       (SELECT count(*) FROM queueworker.tasks_active t
        WHERE t.state = 'running' AND t.lease_owner = w.id)::int AS running,
       w.draining, extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age_seconds, w.started_at
FROM queueworker.workers w
WHERE %(queue)s::text IS NULL OR %(queue)s = ANY(w.queues)
ORDER BY w.started_at
"""


class LiveWorkerRow(NamedTuple):
    id: str
    hostname: str
    pod_name: str | None
    pod_namespace: str | None
    pid: int
    queues: list[str]
    concurrency: int
    running: int
    draining: bool
    heartbeat_age_seconds: float
    started_at: Any

# -- controller: queue depth and per-pod lease counts ---------------------------------------

# One cheap statement per database per tick, whatever the history size: ready and retrying are
# counted only up to %(cap)s (what scaling needs), running is bounded by the fleet's concurrency,
# and the head-of-queue age reads a single claim-index entry. Blocked tasks (waiting on
# prerequisites) are reported, never scaled for, counted up to the cap through their own index.
# Each queue comes with a lookahead (seconds, or NULL for none): waiting tasks (delayed, or retrying
# after their backoff) due by then are counted as `due_soon`, up to the cap, through the index of
# waiting tasks. Without a lookahead that is those already due: the workers' scheduler admits them
# to the claim index, but a fleet at zero replicas has no scheduler running, so they must count.
# With %(throughput)s, the last THROUGHPUT_SAMPLE tasks the database finished (succeeded or failed)
# within THROUGHPUT_WINDOW_SECONDS give each queue's finish rate and mean task duration: one bounded
# walk of the finished-at index for the whole statement, however many queues and however busy.
THROUGHPUT_SAMPLE = 5000
THROUGHPUT_WINDOW_SECONDS = 60
_QUEUE_DEPTH = """
WITH recent AS MATERIALIZED (
    SELECT queue, started_at, finished_at FROM queueworker.tasks
    WHERE %(throughput)s AND state IN ('succeeded', 'failed') AND started_at IS NOT NULL
      AND finished_at > now() - make_interval(secs => """ + str(THROUGHPUT_WINDOW_SECONDS) + """)
    ORDER BY finished_at DESC LIMIT """ + str(THROUGHPUT_SAMPLE) + """
), sampled AS (  -- the seconds the sample covers: the whole window, unless the sample filled first
    SELECT CASE WHEN count(*) < """ + str(THROUGHPUT_SAMPLE) + """ THEN """ + str(THROUGHPUT_WINDOW_SECONDS) + """::float8
                ELSE greatest(extract(epoch FROM now() - min(finished_at))::float8, 0.001) END AS seconds
    FROM recent
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
       {blocked} AS blocked,
       (SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE (state = 'retrying' OR (state = 'pending' AND delayed)) AND queue = q.queue
                                AND run_after <= now() + make_interval(secs => coalesce(q.lookahead, 0))
                              LIMIT %(cap)s) AS s) AS due_soon,
       t.finish_rate, t.recent_task_seconds,
       {flow}
FROM unnest(%(queues)s::text[], %(lookaheads)s::float8[]) AS q(queue, lookahead)
LEFT JOIN LATERAL (
    SELECT count(*) / (SELECT seconds FROM sampled) AS finish_rate,
           avg(extract(epoch FROM r.finished_at - r.started_at))::float8 AS recent_task_seconds
    FROM recent r WHERE %(throughput)s AND r.queue = q.queue HAVING count(*) > 0) AS t ON true
{flow_join}"""
_BLOCKED = """(SELECT count(*) FROM (SELECT 1 FROM queueworker.tasks
                              WHERE state = 'blocked' AND queue = q.queue
                              LIMIT %(cap)s) AS w)"""
# Flow control (migration 009): a paused queue or an open breaker starts nothing whatever its
# backlog; a cap on running tasks or a rate limit bounds the replicas worth running. For a rate,
# the mean duration of the queue's last 100 successes gives the slots it keeps busy (Little's law).
_FLOW = """coalesce(f.paused, false) AS paused, coalesce(f.breaker_open, false) AS breaker_open,
       f.rate_per_second, f.max_running, f.mean_task_seconds"""
_FLOW_JOIN = """LEFT JOIN LATERAL (
    SELECT l.paused_until > now() AS paused, l.breaker_state <> 'closed' AS breaker_open, l.rate_per_second,
           l.max_running,
           CASE WHEN l.rate_per_second IS NOT NULL THEN (
               SELECT avg(extract(epoch FROM d.finished_at - d.started_at))::float8
               FROM (SELECT finished_at, started_at FROM queueworker.tasks
                     WHERE state = 'succeeded' AND queue = l.name ORDER BY finished_at DESC LIMIT 100) AS d)
           END AS mean_task_seconds
    FROM queueworker.queues l WHERE l.name = q.queue AND l.limited) AS f ON true"""
_NO_FLOW = """false AS paused, false AS breaker_open, NULL::float8, NULL::integer, NULL::float8"""


def _queue_depth(blocked: str, flow: str, flow_join: str) -> str:
    return _QUEUE_DEPTH.replace("{blocked}", blocked).replace("{flow}", flow).replace("{flow_join}", flow_join)


QUEUE_DEPTH = _queue_depth(_BLOCKED, _FLOW, _FLOW_JOIN)
# The same against older schemas, whose tenants a newer controller may serve while their workers
# are older: before version 9 (no flow control) and before version 5 (no `blocked` state either).
QUEUE_DEPTH_WITHOUT_FLOW = _queue_depth(_BLOCKED, _NO_FLOW, "")
QUEUE_DEPTH_WITHOUT_BLOCKED = _queue_depth("0::bigint", _NO_FLOW, "")
QUEUE_DEPTHS_BY_AGE = (QUEUE_DEPTH, QUEUE_DEPTH_WITHOUT_FLOW, QUEUE_DEPTH_WITHOUT_BLOCKED)


class QueueDepthRow(NamedTuple):
    queue: str
    lookahead: float | None  # as asked: with the queue, the key of the row
    ready: int
    running: int
    retrying: int
    oldest_ready_age: float | None
    blocked: int
    due_soon: int
    finish_rate: float | None  # tasks/s; None without %(throughput)s or when none finished lately
    recent_task_seconds: float | None
    paused: bool
    breaker_open: bool
    rate_per_second: float | None
    max_running: int | None
    mean_task_seconds: float | None


# Live workers of one namespace with the leases they hold right now (not as of their last
# heartbeat), to price pods for scale-in.
WORKER_LEASES = """
SELECT w.pod_name, count(t.id)::int AS running, w.draining,
       extract(epoch FROM now() - min(t.started_at))::float8 AS oldest_lease_age
FROM queueworker.workers w
LEFT JOIN queueworker.tasks t ON t.lease_owner = w.id AND t.state = 'running'
WHERE w.pod_namespace = %(namespace)s AND w.pod_name IS NOT NULL
  AND %(queue)s = ANY(w.queues)
GROUP BY w.id, w.pod_name, w.running, w.draining
"""

# Cleaner: deletes finished tasks (and their audit rows) older than the retention, oldest first,
# in batches, so history never grows without bound. Guarded like the other duties. A SECURITY
# DEFINER function (migration 003): the worker role may run it, but holds no DELETE on the history
# or the audit trail (docs/security.md).
CLEAN_FINISHED = """
SELECT id FROM queueworker.clean_finished(%(lock_key)s::bigint, %(retention_seconds)s::float8, %(limit)s::integer)
    AS deleted(id)
"""

# -- console ---------------------------------------------------------------------------------
# `queueworker console` (worker/console): read-only pages over a history of any size. Each reads
# through an index with a bounded number of rows: live work (`tasks_active`) is scanned freely,
# finished history only through its primary key or `tasks_finished_at`, newest first, up to a budget.

# Every queue worth a row: those with live work, settings or workers, and those that finished
# tasks lately (the newest CONSOLE_FINISH_SAMPLE finished within the hour, through tasks_finished_at).
CONSOLE_FINISH_SAMPLE = 20000
CONSOLE_QUEUE_NAMES = """
SELECT name FROM (
    SELECT queue AS name FROM queueworker.tasks_active
    UNION SELECT name FROM queueworker.queues
    UNION SELECT unnest(queues) FROM queueworker.workers
    UNION SELECT queue FROM (SELECT queue FROM queueworker.tasks
                             WHERE state IN ('succeeded', 'failed', 'cancelled')
                               AND finished_at > now() - interval '1 hour'
                             ORDER BY finished_at DESC LIMIT """ + str(CONSOLE_FINISH_SAMPLE) + """) AS r
) AS n
ORDER BY name LIMIT %(limit)s
"""


class ConsoleQueueNameRow(NamedTuple):
    name: str


# Finished tasks per queue and outcome over the last %(window)s seconds: the newest
# CONSOLE_FINISH_SAMPLE of them, and the seconds that sample covers (the whole window unless it filled).
CONSOLE_FINISH_RATES = """
WITH recent AS MATERIALIZED (
    SELECT queue, state, finished_at FROM queueworker.tasks
    WHERE state IN ('succeeded', 'failed', 'cancelled') AND finished_at > now() - make_interval(secs => %(window)s)
    ORDER BY finished_at DESC LIMIT """ + str(CONSOLE_FINISH_SAMPLE) + """
), covered AS (
    SELECT CASE WHEN count(*) < """ + str(CONSOLE_FINISH_SAMPLE) + """ THEN %(window)s::float8
                ELSE greatest(extract(epoch FROM now() - min(finished_at))::float8, 0.001) END AS seconds
    FROM recent
)
SELECT queue, count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE state = 'failed') AS failed, count(*) FILTER (WHERE state = 'cancelled') AS cancelled,
       (SELECT seconds FROM covered) AS seconds
FROM recent GROUP BY queue
"""


class ConsoleFinishRateRow(NamedTuple):
    queue: str
    succeeded: int
    failed: int
    cancelled: int
    seconds: float


# A page of tasks, newest first, below id %(before)s: the newest %(scan)s tasks of the partitions
# holding %(states)s are read through the primary key, and those matching the filters are returned
# (at most %(limit)s). Every row also says how many tasks were read and the lowest id among them, so
# a page with few matches continues below what was read; one row of NULL task columns when none match.
CONSOLE_TASKS = """
WITH scanned AS MATERIALIZED (
    SELECT id, queue, task, state, attempts, max_attempts, progress, dedupe_key, lease_owner, created_at, updated_at
    FROM queueworker.tasks
    WHERE id < %(before)s AND state = ANY(%(partition_states)s::queueworker.task_state[])
    ORDER BY id DESC LIMIT %(scan)s
), matched AS (
    SELECT * FROM scanned
    WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
      AND (%(state)s::text IS NULL OR state = %(state)s::queueworker.task_state)
      AND (%(task)s::text IS NULL OR task = %(task)s)
      AND (%(dedupe_key)s::text IS NULL OR dedupe_key = %(dedupe_key)s)
    ORDER BY id DESC LIMIT %(limit)s
)
SELECT m.id, m.queue, m.task, m.state::text AS state, m.attempts, m.max_attempts, m.progress::text AS progress_json,
       m.dedupe_key, m.lease_owner::text AS lease_owner, m.created_at, m.updated_at, s.scanned, s.lowest_scanned
FROM (SELECT count(*) AS scanned, min(id) AS lowest_scanned FROM scanned) AS s
LEFT JOIN matched m ON true
ORDER BY m.id DESC
"""


class ConsoleTaskRow(NamedTuple):
    id: int | None  # None: the row that only says what was scanned
    queue: str | None
    task: str | None
    state: str | None
    attempts: int | None
    max_attempts: int | None
    progress_json: str | None
    dedupe_key: str | None
    lease_owner: str | None
    created_at: Any
    updated_at: Any
    scanned: int
    lowest_scanned: int | None


# The unfinished tasks holding a dedupe key, on any queue: one probe of tasks_dedupe per queue.
CONSOLE_KEY_HOLDERS = """
SELECT id, queue, state::text AS state FROM queueworker.tasks_active
WHERE dedupe_key = %(dedupe_key)s ORDER BY id LIMIT 100
"""


class ConsoleKeyHolderRow(NamedTuple):
    id: int
    queue: str
    state: str


# Leases held right now, per worker, through tasks_running (bounded by the fleet's concurrency).
CONSOLE_WORKER_LEASES = """
SELECT lease_owner::text AS worker, count(*) AS leases, (array_agg(id ORDER BY id))[1:%(shown)s] AS task_ids
FROM queueworker.tasks WHERE state = 'running' GROUP BY lease_owner
"""


class ConsoleWorkerLeasesRow(NamedTuple):
    worker: str
    leases: int
    task_ids: list[int]


# Bounded versions of the statements `queueworker show` and `queueworker run show` print in full.
CONSOLE_TASK_EVENTS = TASK_EVENTS.rstrip() + " LIMIT %(limit)s\n"
CONSOLE_RUN_TASKS = RUN_TASKS.rstrip() + " LIMIT %(limit)s\n"
