-- Enqueueing: the producer's statements (queueworker.client.producer), run in the caller's transaction.
-- Each statement is declared, with its parameter and row types, in queueworker/db/enqueue.py.
--
-- Plain tasks are inserted through the view queueworker.new_tasks (migration 019), which inserts
-- into queueworker.tasks and shows no row, so a producer learns the ids of the tasks it inserts and
-- of no other; the library needs schema version 19 for it (run `queueworker migrate` first).
--
-- Every insert wakes idle workers with one NOTIFY per queue per statement (delivered at commit, so it
-- rides the caller's transaction); a batch that is only due later carries its due time, so listeners
-- schedule a precise wake-up instead of polling. A batch without headers is inserted by the
-- statements without `headers` in their names, and a batch without keys by those without `keys`. A batch with keys takes the `with_keys` variant, which stores headers too: the
-- plain statements stay as short as they were, and keys add one variant each, not two. One spec
-- alone takes `enqueue_one`, which stores every column (NULL headers and key where it has none).

-- name: enqueue
-- Plain specs (neither unique nor dependent), one row per element of the array parameters, in order:
-- one statement for any batch size.
WITH inserted AS (
    INSERT INTO queueworker.new_tasks (queue, task, payload, priority, run_after, delayed, max_attempts, timeout_seconds)
    SELECT s.queue, s.task, s.payload, s.priority, coalesce(s.run_after, now()), coalesce(s.run_after > now(), false),
           s.max_attempts, s.timeout_seconds
    FROM unnest(%(queues)s::text[], %(tasks)s::text[], %(payloads)s::jsonb[], %(priorities)s::int[],
                %(run_afters)s::timestamptz[], %(max_attempts)s::int[], %(timeouts)s::int[])
         WITH ORDINALITY AS s(queue, task, payload, priority, run_after, max_attempts, timeout_seconds, ord)
    ORDER BY s.ord
    RETURNING id, queue, run_after
), notified AS (
    SELECT pg_notify('queueworker',
                     CASE WHEN min(run_after) <= now() THEN queue
                          ELSE queue || ' ' || extract(epoch FROM min(run_after))::text END)
    FROM inserted GROUP BY queue
)
SELECT id, (SELECT count(*) FROM notified) AS notified FROM inserted ORDER BY id;

-- name: enqueue_one
-- One plain spec, with its headers and key (NULL when it has none): the common case of an application
-- enqueueing one task per request. A producer's statements are never prepared (statements.py says
-- why), so each is parsed and planned at every call: this one in about 0.4 ms less than `enqueue` with
-- arrays of one element, most of an idle enqueue's own time (measured 2026-12-07, bench/notes.md).
WITH inserted AS (
    INSERT INTO queueworker.new_tasks (queue, task, payload, priority, run_after, delayed, max_attempts, timeout_seconds,
                                       headers, key)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, coalesce(%(run_after)s::timestamptz, now()),
            coalesce(%(run_after)s::timestamptz > now(), false), %(max_attempts)s, %(timeout)s, %(headers)s::jsonb,
            %(key)s)
    RETURNING id, queue, run_after
), notified AS (
    SELECT pg_notify('queueworker', CASE WHEN run_after <= now() THEN queue
                                         ELSE queue || ' ' || extract(epoch FROM run_after)::text END)
    FROM inserted
)
SELECT id, (SELECT count(*) FROM notified) AS notified FROM inserted;

-- name: enqueue_with_headers
-- The same, for a batch in which some spec has headers.
WITH inserted AS (
    INSERT INTO queueworker.new_tasks (queue, task, payload, priority, run_after, delayed, max_attempts, timeout_seconds,
                                   headers)
    SELECT s.queue, s.task, s.payload, s.priority, coalesce(s.run_after, now()), coalesce(s.run_after > now(), false),
           s.max_attempts, s.timeout_seconds, s.headers
    FROM unnest(%(queues)s::text[], %(tasks)s::text[], %(payloads)s::jsonb[], %(priorities)s::int[],
                %(run_afters)s::timestamptz[], %(max_attempts)s::int[], %(timeouts)s::int[], %(headers)s::jsonb[])
         WITH ORDINALITY AS s(queue, task, payload, priority, run_after, max_attempts, timeout_seconds, headers, ord)
    ORDER BY s.ord
    RETURNING id, queue, run_after
), notified AS (
    SELECT pg_notify('queueworker',
                     CASE WHEN min(run_after) <= now() THEN queue
                          ELSE queue || ' ' || extract(epoch FROM min(run_after))::text END)
    FROM inserted GROUP BY queue
)
SELECT id, (SELECT count(*) FROM notified) AS notified FROM inserted ORDER BY id;

-- name: enqueue_with_keys
-- The same, for a batch in which some spec has a key (TaskSpec.key), with each spec's headers.
WITH inserted AS (
    INSERT INTO queueworker.new_tasks (queue, task, payload, priority, run_after, delayed, max_attempts, timeout_seconds,
                                   headers, key)
    SELECT s.queue, s.task, s.payload, s.priority, coalesce(s.run_after, now()), coalesce(s.run_after > now(), false),
           s.max_attempts, s.timeout_seconds, s.headers, s.key
    FROM unnest(%(queues)s::text[], %(tasks)s::text[], %(payloads)s::jsonb[], %(priorities)s::int[],
                %(run_afters)s::timestamptz[], %(max_attempts)s::int[], %(timeouts)s::int[], %(headers)s::jsonb[],
                %(keys)s::text[])
         WITH ORDINALITY AS s(queue, task, payload, priority, run_after, max_attempts, timeout_seconds, headers, key,
                              ord)
    ORDER BY s.ord
    RETURNING id, queue, run_after
), notified AS (
    SELECT pg_notify('queueworker',
                     CASE WHEN min(run_after) <= now() THEN queue
                          ELSE queue || ' ' || extract(epoch FROM min(run_after))::text END)
    FROM inserted GROUP BY queue
)
SELECT id, (SELECT count(*) FROM notified) AS notified FROM inserted ORDER BY id;

-- name: staging_state
-- Whether this transaction has a staging table already, whether the role may create one (TEMPORARY
-- on the database, granted to PUBLIC unless revoked), and whether the statement may set the spec
-- hash itself: the role may insert it (the owner; a least-privilege producer may not, so that it
-- cannot forge one, and its rows get theirs from the trigger).
SELECT to_regclass('pg_temp.queueworker_staged_tasks') IS NOT NULL AS exists,
       has_database_privilege(current_database(), 'TEMPORARY') AS allowed,
       has_column_privilege('queueworker.new_tasks', 'spec_hash', 'INSERT') AS spec_hash;

-- name: create_staging
-- The fast path of a big batch of plain specs (producer.COPY_THRESHOLD): COPY into a temporary staging
-- table, then one of the enqueue_staged statements inserts them in one statement, as `enqueue` does with
-- arrays. Sending the rows costs the client a fraction of what binding them as array parameters does,
-- and the server parses them while the client is still sending. The table has the columns `enqueue`
-- takes, typed as the table's, so the COPY parses payloads and headers once; it is dropped when the
-- transaction ends. `key` stays NULL unless copy_staging_with_keys fills it.
CREATE TEMPORARY TABLE queueworker_staged_tasks (
    ord bigint NOT NULL, queue text NOT NULL, task text NOT NULL, payload jsonb NOT NULL, priority integer NOT NULL,
    run_after timestamptz, max_attempts integer NOT NULL, timeout_seconds integer, headers jsonb, key text
) ON COMMIT DROP;

-- name: empty_staging
-- Before each further batch that reuses this transaction's staging table.
TRUNCATE pg_temp.queueworker_staged_tasks;

-- name: copy_staging
-- Text format (producer.Copy says why); the columns in the order of producer._staged_rows.
COPY pg_temp.queueworker_staged_tasks (ord, queue, task, payload, priority, run_after, max_attempts, timeout_seconds,
                                   headers)
FROM STDIN;

-- name: copy_staging_with_keys
-- copy_staging with each spec's key (producer._staged_rows adds it last), for a batch in which some
-- spec has one.
COPY pg_temp.queueworker_staged_tasks (ord, queue, task, payload, priority, run_after, max_attempts, timeout_seconds,
                                   headers, key)
FROM STDIN;

-- name: enqueue_staged
-- `enqueue`, from the staging table that copy_staging filled.
WITH inserted AS (
    INSERT INTO queueworker.new_tasks (queue, task, payload, priority, run_after, delayed, max_attempts, timeout_seconds)
    SELECT s.queue, s.task, s.payload, s.priority, coalesce(s.run_after, now()), coalesce(s.run_after > now(), false),
           s.max_attempts, s.timeout_seconds
    FROM pg_temp.queueworker_staged_tasks s
    ORDER BY s.ord
    RETURNING id, queue, run_after
), notified AS (
    SELECT pg_notify('queueworker',
                     CASE WHEN min(run_after) <= now() THEN queue
                          ELSE queue || ' ' || extract(epoch FROM min(run_after))::text END)
    FROM inserted GROUP BY queue
)
SELECT id, (SELECT count(*) FROM notified) AS notified FROM inserted ORDER BY id;

-- name: enqueue_staged_with_headers
-- The same, for a batch in which some spec has headers.
WITH inserted AS (
    INSERT INTO queueworker.new_tasks (queue, task, payload, priority, run_after, delayed, max_attempts, timeout_seconds,
                                   headers)
    SELECT s.queue, s.task, s.payload, s.priority, coalesce(s.run_after, now()), coalesce(s.run_after > now(), false),
           s.max_attempts, s.timeout_seconds, s.headers
    FROM pg_temp.queueworker_staged_tasks s
    ORDER BY s.ord
    RETURNING id, queue, run_after
), notified AS (
    SELECT pg_notify('queueworker',
                     CASE WHEN min(run_after) <= now() THEN queue
                          ELSE queue || ' ' || extract(epoch FROM min(run_after))::text END)
    FROM inserted GROUP BY queue
)
SELECT id, (SELECT count(*) FROM notified) AS notified FROM inserted ORDER BY id;

-- name: enqueue_staged_hashed
-- enqueue_staged, computing the spec hash in the statement (the row trigger of migration 004 then skips
-- the row), which costs the database less than a trigger call per row; for a role that may insert it
-- (staging_state says).
WITH inserted AS (
    INSERT INTO queueworker.new_tasks (queue, task, payload, priority, run_after, delayed, max_attempts, timeout_seconds,
                                   spec_hash)
    SELECT s.queue, s.task, s.payload, s.priority, coalesce(s.run_after, now()), coalesce(s.run_after > now(), false),
           s.max_attempts, s.timeout_seconds, queueworker.spec_hash(s.queue, s.task, s.payload)
    FROM pg_temp.queueworker_staged_tasks s
    ORDER BY s.ord
    RETURNING id, queue, run_after
), notified AS (
    SELECT pg_notify('queueworker',
                     CASE WHEN min(run_after) <= now() THEN queue
                          ELSE queue || ' ' || extract(epoch FROM min(run_after))::text END)
    FROM inserted GROUP BY queue
)
SELECT id, (SELECT count(*) FROM notified) AS notified FROM inserted ORDER BY id;

-- name: enqueue_staged_with_headers_hashed
-- enqueue_staged_with_headers, computing the spec hash as enqueue_staged_hashed does.
WITH inserted AS (
    INSERT INTO queueworker.new_tasks (queue, task, payload, priority, run_after, delayed, max_attempts, timeout_seconds,
                                   headers, spec_hash)
    SELECT s.queue, s.task, s.payload, s.priority, coalesce(s.run_after, now()), coalesce(s.run_after > now(), false),
           s.max_attempts, s.timeout_seconds, s.headers, queueworker.spec_hash(s.queue, s.task, s.payload)
    FROM pg_temp.queueworker_staged_tasks s
    ORDER BY s.ord
    RETURNING id, queue, run_after
), notified AS (
    SELECT pg_notify('queueworker',
                     CASE WHEN min(run_after) <= now() THEN queue
                          ELSE queue || ' ' || extract(epoch FROM min(run_after))::text END)
    FROM inserted GROUP BY queue
)
SELECT id, (SELECT count(*) FROM notified) AS notified FROM inserted ORDER BY id;

-- name: enqueue_staged_with_keys
-- enqueue_staged_with_headers with each spec's key, after copy_staging_with_keys.
WITH inserted AS (
    INSERT INTO queueworker.new_tasks (queue, task, payload, priority, run_after, delayed, max_attempts, timeout_seconds,
                                   headers, key)
    SELECT s.queue, s.task, s.payload, s.priority, coalesce(s.run_after, now()), coalesce(s.run_after > now(), false),
           s.max_attempts, s.timeout_seconds, s.headers, s.key
    FROM pg_temp.queueworker_staged_tasks s
    ORDER BY s.ord
    RETURNING id, queue, run_after
), notified AS (
    SELECT pg_notify('queueworker',
                     CASE WHEN min(run_after) <= now() THEN queue
                          ELSE queue || ' ' || extract(epoch FROM min(run_after))::text END)
    FROM inserted GROUP BY queue
)
SELECT id, (SELECT count(*) FROM notified) AS notified FROM inserted ORDER BY id;

-- name: enqueue_staged_with_keys_hashed
-- enqueue_staged_with_keys, computing the spec hash as enqueue_staged_hashed does.
WITH inserted AS (
    INSERT INTO queueworker.new_tasks (queue, task, payload, priority, run_after, delayed, max_attempts, timeout_seconds,
                                   headers, key, spec_hash)
    SELECT s.queue, s.task, s.payload, s.priority, coalesce(s.run_after, now()), coalesce(s.run_after > now(), false),
           s.max_attempts, s.timeout_seconds, s.headers, s.key, queueworker.spec_hash(s.queue, s.task, s.payload)
    FROM pg_temp.queueworker_staged_tasks s
    ORDER BY s.ord
    RETURNING id, queue, run_after
), notified AS (
    SELECT pg_notify('queueworker',
                     CASE WHEN min(run_after) <= now() THEN queue
                          ELSE queue || ' ' || extract(epoch FROM min(run_after))::text END)
    FROM inserted GROUP BY queue
)
SELECT id, (SELECT count(*) FROM notified) AS notified FROM inserted ORDER BY id;

-- name: enqueue_tasks
-- Everything beyond a plain task: dedupe keys (TaskSpec.dedupe_key, or dedupe="spec": the hex spec
-- hash as the key) and prerequisites (TaskSpec.depends_on: the task starts `blocked`), through a
-- definer function (migrations 004 and 006) that inserts into `tasks_active`, whose unique index is
-- the ON CONFLICT arbiter, records the edges and wakes the queues: the producer role needs no right
-- on the partition or the edges. DO NOTHING, not DO UPDATE: a duplicate takes no lock on the existing
-- task, so a producer's open transaction never holds up the worker that runs it. One row per spec,
-- in order: its key, and its new id, or NULL when a task held the key already (a duplicate within
-- the batch gets the id of the first spec with its key). `prerequisite_ords[i]` is the 1-based
-- position of the spec that depends on task `prerequisite_ids[i]`; `run_ids` and `run_partitions`
-- place partitions in their run (migration 006).
SELECT ord, queue, dedupe_key, id, notified
FROM queueworker.enqueue_tasks(%(queues)s::text[], %(tasks)s::text[], %(payloads)s::jsonb[], %(priorities)s::int[],
                               %(run_afters)s::timestamptz[], %(max_attempts)s::int[], %(timeouts)s::int[],
                               %(dedupe_keys)s::text[], %(by_spec)s::bool[], %(cancel_on_failure)s::bool[],
                               %(prerequisite_ords)s::bigint[], %(prerequisite_ids)s::bigint[],
                               %(run_ids)s::bigint[], %(run_partitions)s::int[]);

-- name: enqueue_tasks_with_headers
-- The same with each spec's headers, for batches that have some (as enqueue_with_headers).
SELECT ord, queue, dedupe_key, id, notified
FROM queueworker.enqueue_tasks(%(queues)s::text[], %(tasks)s::text[], %(payloads)s::jsonb[], %(priorities)s::int[],
                               %(run_afters)s::timestamptz[], %(max_attempts)s::int[], %(timeouts)s::int[],
                               %(dedupe_keys)s::text[], %(by_spec)s::bool[], %(cancel_on_failure)s::bool[],
                               %(prerequisite_ords)s::bigint[], %(prerequisite_ids)s::bigint[],
                               %(run_ids)s::bigint[], %(run_partitions)s::int[], %(headers)s::jsonb[]);

-- name: enqueue_tasks_with_keys
-- The same with each spec's headers and key, for batches in which some spec has a key (migration 018).
SELECT ord, queue, dedupe_key, id, notified
FROM queueworker.enqueue_tasks(%(queues)s::text[], %(tasks)s::text[], %(payloads)s::jsonb[], %(priorities)s::int[],
                               %(run_afters)s::timestamptz[], %(max_attempts)s::int[], %(timeouts)s::int[],
                               %(dedupe_keys)s::text[], %(by_spec)s::bool[], %(cancel_on_failure)s::bool[],
                               %(prerequisite_ords)s::bigint[], %(prerequisite_ids)s::bigint[],
                               %(run_ids)s::bigint[], %(run_partitions)s::int[], %(headers)s::jsonb[],
                               %(keys)s::text[]);

-- name: enqueue_existing
-- The task holding each key, for the specs enqueue_tasks did not insert: the unfinished one, else
-- (it finished since) the one that finished last. A new statement, so it sees the duplicate that the
-- insert waited for; through a definer function (migration 016's version of the functions), so the
-- producer reads keys and states of its own queues only.
SELECT ord, id, state FROM queueworker.existing_tasks(%(ords)s::bigint[], %(queues)s::text[], %(dedupe_keys)s::text[]);

-- name: enqueue_replace
-- on_conflict="replace": a duplicate that is still `pending` takes the new spec's payload, priority
-- and schedule (the last spec wins within a batch), through a definer function (migration 004) that
-- changes only pending tasks with a dedupe key. It updates through the parent, so the update trigger
-- audits it (`pending -> pending`, detail `replaced`); only rows that really change are touched. A
-- spec due now keeps a due task's place in line, and makes a delayed one due now.
SELECT id, notified
FROM queueworker.replace_pending(%(ids)s::bigint[], %(payloads)s::jsonb[], %(priorities)s::int[],
                                 %(run_afters)s::timestamptz[]);

-- name: notify_on_finish
-- Marks tasks just enqueued (in the producer's transaction) to notify the channel queueworker_finished
-- when they end (the complete statements of lease.sql), which queueworker.wait_for listens to; through a
-- definer function (migration 016's version of the functions), so the producer holds no UPDATE on tasks.
SELECT id FROM queueworker.mark_notify_on_finish(%(ids)s::bigint[]) AS id;
