-- Least-privilege database roles for queueworker, schema version 26. Why each grant exists, and
-- what the roles still can do: docs/security.md.
--
-- Run it as a superuser, in the application's database:
--
--     psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -f docs/database-roles.sql
--
-- On a new installation run it twice: before the first `queueworker migrate` (it creates the
-- roles and the `queueworker` schema owned by the migrator; the grants wait for the tables and
-- say so in a NOTICE), and again after it (it grants on what the migrations created). It is
-- idempotent: run it again after every upgrade. A release whose migrations add objects ships
-- their grants here; the script refuses a schema version newer than the one it was written for.
--
-- Five NOLOGIN group roles, one per duty; people and programs log in as members of one of them:
--   queueworker_migrator    owns the schema; runs `queueworker migrate`
--   queueworker_producer    enqueues tasks (queueworker.enqueue / enqueue_many, `queueworker enqueue`, and
--                           in SQL queueworker.enqueue / enqueue_many / task_status)
--   queueworker_worker      runs `queueworker worker`: claims, completes, heartbeats, rescues,
--                           schedules, cleans history past the retention
--   queueworker_controller  the Kubernetes controller: reads queue depth and leases, LISTENs
--   queueworker_operator    people: `queueworker status`, `queueworker retry`, `queueworker cancel`
--
-- Login roles, e.g. (in psql, `\password NAME` sets a password without it reaching the server
-- log or the shell history):
--
--     CREATE ROLE billing_app LOGIN IN ROLE queueworker_producer;
--     CREATE ROLE qw_worker LOGIN IN ROLE queueworker_worker;
--     CREATE ROLE qw_controller LOGIN IN ROLE queueworker_controller;
--     CREATE ROLE alice LOGIN IN ROLE queueworker_operator;
--     CREATE ROLE qw_migrate LOGIN IN ROLE queueworker_migrator;
--     -- Objects a migration creates must belong to the group, not to the login that ran it:
--     ALTER ROLE qw_migrate SET role = 'queueworker_migrator';
--
-- An application that also enqueues keeps its own login and is granted the producer group:
--     GRANT queueworker_producer TO billing_app;

-- 1. The group roles.
DO $$
DECLARE
    group_role text;
BEGIN
    FOREACH group_role IN ARRAY ARRAY['queueworker_migrator', 'queueworker_producer', 'queueworker_worker',
                                      'queueworker_controller', 'queueworker_operator'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = group_role) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', group_role);
        END IF;
    END LOOP;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO queueworker_migrator, queueworker_producer, queueworker_worker, '
                   'queueworker_controller, queueworker_operator', current_database());
END
$$;

-- 2. The schema, owned by the migrator, which needs no CREATE on the database.
CREATE SCHEMA IF NOT EXISTS queueworker AUTHORIZATION queueworker_migrator;

-- 3. An installation migrated before these roles existed: everything in the schema passes to the
--    migrator (a no-op once it owns everything). Indexes, identity sequences and the row types of
--    tables follow their table; the enum's array type follows the enum.
DO $$
DECLARE
    statement text;
BEGIN
    FOR statement IN
        SELECT 'ALTER SCHEMA queueworker OWNER TO queueworker_migrator'
        FROM pg_catalog.pg_namespace
        WHERE nspname = 'queueworker' AND nspowner <> 'queueworker_migrator'::regrole
        UNION ALL
        SELECT format('ALTER TABLE %s OWNER TO queueworker_migrator', c.oid::regclass)
        FROM pg_catalog.pg_class c
        WHERE c.relnamespace = 'queueworker'::regnamespace AND c.relkind IN ('r', 'p')
          AND c.relowner <> 'queueworker_migrator'::regrole
        UNION ALL
        SELECT format('ALTER TYPE %s OWNER TO queueworker_migrator', t.oid::regtype)
        FROM pg_catalog.pg_type t
        WHERE t.typnamespace = 'queueworker'::regnamespace AND t.typtype = 'e'
          AND t.typowner <> 'queueworker_migrator'::regrole
        UNION ALL
        SELECT format('ALTER FUNCTION %s OWNER TO queueworker_migrator', p.oid::regprocedure)
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'queueworker'::regnamespace AND p.proowner <> 'queueworker_migrator'::regrole
    LOOP
        EXECUTE statement;
    END LOOP;
END
$$;

-- 4. Objects later migrations create. Functions are executable by PUBLIC unless revoked, and a
--    new one may be a SECURITY DEFINER: none is callable until granted below. Operators may read
--    every new table at once; every other role gets exactly the grants its statements need, here,
--    in the release that adds the object. The statements named below (ENQUEUE, QUEUE_DEPTH, ...)
--    are the named statements in worker/db/*.sql, in lower case there.
ALTER DEFAULT PRIVILEGES FOR ROLE queueworker_migrator REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
ALTER DEFAULT PRIVILEGES FOR ROLE queueworker_migrator IN SCHEMA queueworker
    GRANT SELECT ON TABLES TO queueworker_operator;

-- 5. The grants, for schema version 26.
DO $$
DECLARE
    applied_version integer;
BEGIN
    IF to_regclass('queueworker.schema_migrations') IS NOT NULL THEN
        SELECT max(m.version) INTO applied_version FROM queueworker.schema_migrations m;
    END IF;
    IF coalesce(applied_version, 0) < 26 THEN
        RAISE NOTICE 'queueworker is at schema version %, these grants are for version 26: run `queueworker '
                     'migrate` as a member of queueworker_migrator, then run this script again',
                     coalesce(applied_version, 0);
        RETURN;
    END IF;
    IF applied_version > 26 THEN
        RAISE EXCEPTION 'these grants are for queueworker schema version 26, the database is at version %: '
                        'run the database-roles.sql of the queueworker release that migrated it', applied_version;
    END IF;

    GRANT USAGE ON SCHEMA queueworker
        TO queueworker_producer, queueworker_worker, queueworker_controller, queueworker_operator;
    GRANT USAGE ON TYPE queueworker.task_state
        TO queueworker_producer, queueworker_worker, queueworker_controller, queueworker_operator;
    GRANT USAGE ON TYPE queueworker.run_state TO queueworker_operator;
    -- The trigger functions queueworker.audit_task_inserts, queueworker.audit_task_updates and
    -- queueworker.forbid_event_updates need no EXECUTE grant: a trigger fires whoever causes it.
    -- Nor do queueworker.require_queues (queue grants, above), queueworker.check_run_task_spec (start_run's),
    -- queueworker.replaced_columns, queueworker.counted_as, queueworker.dependency_verdict,
    -- queueworker.settle_edges and queueworker.settle_cascade: only the owner's definer functions
    -- and triggers call them (queueworker.settle_new_dependent is the trigger that settles a new
    -- dependent's edges at commit). queueworker.task_dependencies, the edges, is written only by them too;
    -- the operator reads it with every other table. Runs likewise: queueworker.runs and
    -- queueworker.watermarks are written only by queueworker.start_run (the producer's) and
    -- queueworker.count_run_outcomes (the worker's COMPLETE_SUCCEEDED, and the update trigger),
    -- through queueworker.advance_run, queueworker.finish_run and queueworker.enqueue_run_task.
    -- queueworker.run_events, the runs' audit trail, is written only by the trigger function
    -- queueworker.audit_run; the operator reads it.
    -- queueworker.schema_functions records the function files (migrations/functions/) as last
    -- applied, as queueworker.schema_migrations records the versioned migrations: created and written
    -- by `queueworker migrate` only, so it stays the migrator's; nobody else needs it (the operator
    -- reads it with every other table).
    REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA queueworker FROM PUBLIC;

    -- Queue grants (migration 016; `queueworker grant`, `revoke`, `grants`): once any grant exists, a
    -- producer login may use only the queues its grants match. The insert trigger
    -- (queueworker.audit_task_inserts) refuses a plain insert into another's queue; the definer
    -- functions it calls check their arguments with queueworker.require_queues; it reads which task
    -- holds a key through queueworker.existing_tasks. queueworker.glob_like,
    -- queueworker.unbound_by_grants and queueworker.queue_patterns compute what a login may use; only
    -- those functions and triggers call them. Not row-level security: with it on, Postgres plans every
    -- other role's statements on tasks without the statistics of non-leakproof operators (the enum's
    -- `=`), which made the controller's depth read several times slower. The operator grants and
    -- revokes (queueworker.grant_queue, queueworker.revoke_queue); queueworker.queue_grants is read by
    -- it with every other table.
    GRANT EXECUTE ON FUNCTION queueworker.grant_queue(text, text), queueworker.revoke_queue(text, text)
        TO queueworker_operator;

    -- Producer (ENQUEUE, START_RUN): inserts the columns a TaskSpec sets, reads back what ENQUEUE returns.
    -- It cannot choose a state, a lease or an id, so it cannot forge a task's history, and it
    -- cannot read other tasks' payloads, results or errors. Its audit row is written by the
    -- insert trigger, as the owner. Unique and dependent tasks go through definer functions
    -- (ENQUEUE_TASKS, ENQUEUE_REPLACE: nothing but inserting such tasks with their edges, and
    -- changing pending ones that have a key); ENQUEUE_EXISTING reads which task holds a key. The trigger queueworker.fill_spec_hash
    -- runs queueworker.spec_hash as the role that inserts a task or moves one back (a retry).
    -- Plain tasks go in through the view queueworker.new_tasks (version 19), which inserts into
    -- queueworker.tasks and shows no row: RETURNING gives the producer the ids of what it inserted
    -- and nothing else. Workers enqueue through it too (a handler's enqueue on the worker's
    -- connection). The producer holds nothing on queueworker.tasks itself; what earlier versions
    -- granted is taken back: INSERT and SELECT (id, queue, run_after) there (before version 19; the
    -- SELECT that RETURNING needs let it list every tenant's tasks), SELECT (state, dedupe_key)
    -- (before 16; queueworker.existing_tasks reads them now, for the producer's own queues only) and
    -- UPDATE (notify_on_finish) (before 16; it also let it lock any task row with SELECT ... FOR
    -- UPDATE). NOTIFY_ON_FINISH marks the tasks just enqueued with notify_on_finish (wait_for)
    -- through the definer function queueworker.mark_notify_on_finish; the trigger function
    -- queueworker.notify_finished sends the notification when they end.
    GRANT INSERT (queue, task, payload, priority, run_after, delayed, max_attempts, timeout_seconds, headers, key),
          SELECT (id, queue, run_after)
        ON queueworker.new_tasks TO queueworker_producer, queueworker_worker;
    REVOKE ALL ON queueworker.tasks FROM queueworker_producer;
    GRANT EXECUTE ON FUNCTION queueworker.mark_notify_on_finish(bigint[]) TO queueworker_producer;
    GRANT EXECUTE ON FUNCTION
            queueworker.enqueue_tasks(text[], text[], jsonb[], integer[], timestamptz[], integer[], integer[],
                                      text[], boolean[], boolean[], bigint[], bigint[], bigint[], integer[]),
            queueworker.enqueue_tasks(text[], text[], jsonb[], integer[], timestamptz[], integer[], integer[],
                                      text[], boolean[], boolean[], bigint[], bigint[], bigint[], integer[], jsonb[]),
            queueworker.enqueue_tasks(text[], text[], jsonb[], integer[], timestamptz[], integer[], integer[],
                                      text[], boolean[], boolean[], bigint[], bigint[], bigint[], integer[], jsonb[],
                                      text[]),
            queueworker.start_run(text, integer, jsonb, jsonb, text),
            queueworker.start_run(text, integer, jsonb, jsonb, text, text[]),
            queueworker.replace_pending(bigint[], jsonb[], integer[], timestamptz[]),
            queueworker.existing_tasks(bigint[], text[], text[])
        TO queueworker_producer;
    GRANT EXECUTE ON FUNCTION queueworker.spec_hash(text, text, jsonb)
        TO queueworker_producer, queueworker_worker, queueworker_operator;
    -- The SQL producer API (migrations/functions/65_sql_producer.sql, docs/producers.md), for producers
    -- in any language: queueworker.enqueue and queueworker.enqueue_many check a spec as TaskSpec does and
    -- enqueue it through the definer functions above (so queue grants hold as for the library);
    -- queueworker.task_status reads back the state, attempts, result and error of a task of the
    -- login's queues. queueworker.printable_text, queueworker.python_json_length,
    -- queueworker.task_spec_problem, queueworker.spec_field and queueworker.enqueue_checked_specs need
    -- no grant: only those three call them. A database migrated by an earlier release at this version
    -- has no such functions yet: their grants wait for `queueworker migrate`, and say so.
    IF to_regprocedure('queueworker.enqueue_many(jsonb)') IS NULL THEN
        RAISE NOTICE 'queueworker.enqueue, enqueue_many and task_status are missing: run `queueworker migrate` '
                     'as a member of queueworker_migrator, then run this script again';
    ELSE
        GRANT EXECUTE ON FUNCTION
                queueworker.enqueue(text, jsonb, text, bigint, timestamptz, double precision, bigint, bigint, text,
                                    text, text, text, bigint[], text, jsonb, boolean),
                queueworker.enqueue_many(jsonb),
                queueworker.task_status(bigint)
            TO queueworker_producer;
    END IF;

    -- Worker. Through the parent: HEARTBEAT, COMPLETE_FAILED, RELEASE, RESCUE, PROMOTE_DUE.
    -- Aimed at the partitions: CLAIM (tasks_active), COMPLETE_SUCCEEDED (moves a row from
    -- tasks_active to tasks_finished). Those two write their own audit rows, hence INSERT on
    -- task_events (and nothing else there); COMPLETE_SUCCEEDED settles the tasks waiting on those it
    -- finished through queueworker.settle_dependents. Retention (CLEAN_FINISHED, CLEAN_RUNS,
    -- CLEAN_QUEUE_EVENTS, CLEAN_WATERMARKS, CLEAN_KEY_STATE) goes through the definer functions
    -- queueworker.clean_finished, queueworker.clean_runs, queueworker.clean_queue_events,
    -- queueworker.clean_watermarks and queueworker.clean_key_state: the worker deletes no history,
    -- run, event, watermark or key state itself.
    -- queueworker.retention_cutoff, which checks their arguments, needs no grant: only they call it.
    -- RESCUE and PROMOTE_DUE lock their duty's row of queueworker.duty_locks (one worker at a time
    -- does each duty): UPDATE on that table is what lets a role lock its rows, and no other role
    -- has it, so no other login can hold a duty up. The retention functions lock their rows as
    -- the owner.
    GRANT SELECT ON queueworker.schema_migrations TO queueworker_worker;
    GRANT SELECT, UPDATE ON queueworker.duty_locks TO queueworker_worker;
    GRANT SELECT, UPDATE ON queueworker.tasks TO queueworker_worker;
    GRANT SELECT, UPDATE, DELETE ON queueworker.tasks_active TO queueworker_worker;
    GRANT SELECT, INSERT ON queueworker.tasks_finished TO queueworker_worker;
    GRANT INSERT ON queueworker.task_events TO queueworker_worker;
    GRANT SELECT, INSERT, UPDATE, DELETE ON queueworker.workers TO queueworker_worker;
    -- COMPLETE_CONTINUED enqueues a task's next page (Continue): the columns it copies, and the
    -- NOTIFY that wakes workers for it through queueworker.wake_queue. SAVE_CHECKPOINT updates
    -- tasks_active (granted above).
    GRANT INSERT (queue, task, payload, priority, run_after, delayed, max_attempts, timeout_seconds, run_id,
                  run_partition, continued_from, headers, key)
        ON queueworker.tasks TO queueworker_worker;
    GRANT EXECUTE ON FUNCTION queueworker.wake_queue(text, timestamptz) TO queueworker_worker;
    -- CLAIM and CLAIM_FAIR (schema version 26) are these functions, run with the worker's own rights
    -- (security invoker: the grants above on tasks_active and task_events are what they use).
    GRANT EXECUTE ON FUNCTION queueworker.claim_tasks(text, integer, uuid, float8, float8, boolean),
                              queueworker.claim_fair_tasks(text, integer, uuid, float8, float8, boolean)
        TO queueworker_worker;
    -- Flow control: CLAIM reads whether a queue is limited; CLAIM_LIMITED locks the queue's row and
    -- charges its token bucket or moves its breaker to half-open; RECORD_BREAKER counts failures.
    -- queueworker.queue_events is written only by the trigger function queueworker.audit_queue.
    GRANT SELECT, UPDATE (tokens, tokens_at, breaker_state, consecutive_failures, breaker_changed_at)
        ON queueworker.queues TO queueworker_worker;
    -- Per-key limits (schema version 21): CLAIM_KEYS reads the keys' own settings and charges the
    -- buckets of the keys it claimed from (queueworker.key_state, the claim's state and nothing
    -- else); LIMITED_QUEUES reads the keys' rates. LOCK_KEYS locks the queue's row and ends the key
    -- pauses whose time has passed through the definer function queueworker.lock_key_limited_queue,
    -- which ends nothing else (the worker cannot write queue_keys). The trigger functions
    -- queueworker.note_key_limits, queueworker.key_limited_queue_keyed, queueworker.retag_resumed_key,
    -- queueworker.refuse_claims_blind_to_key_limits and queueworker.make_keyed need no grant.
    GRANT SELECT ON queueworker.queue_keys TO queueworker_worker;
    GRANT SELECT, INSERT, UPDATE ON queueworker.key_state TO queueworker_worker;
    GRANT EXECUTE ON FUNCTION queueworker.lock_key_limited_queue(text) TO queueworker_worker;
    -- Per-key breakers and key health (schema version 22): CLAIM_KEYS passes over the keys whose
    -- breaker is open and moves a probed key's to half-open; RECORD_KEY_OUTCOMES writes each key's
    -- failure streak, last success and failure, and moves its breaker (key_state, above) by
    -- queueworker.key_breaker_next, which reads the queue's threshold and decides nothing else.
    -- Transitions are audited by the trigger function queueworker.audit_key_breaker: no grant.
    -- LOCK_KEYS calls the two-argument queueworker.lock_key_limited_queue (the one-argument form is
    -- the workers' of version 21, whose claims it marks blind to per-key breakers).
    GRANT EXECUTE ON FUNCTION queueworker.key_breaker_next(text, text, integer, boolean, integer),
                              queueworker.lock_key_limited_queue(text, boolean) TO queueworker_worker;
    -- CLAIM tells a run's tasks their run (ctx.run): these columns of queueworker.runs, nothing else.
    GRANT SELECT (id, name, watermark, watermark_before, forced) ON queueworker.runs TO queueworker_worker;
    GRANT EXECUTE ON FUNCTION queueworker.transition_detail(integer, jsonb, jsonb),
                              queueworker.clean_finished(float8, integer),
                              queueworker.clean_finished(bigint, float8, integer),
                              queueworker.clean_runs(float8, integer),
                              queueworker.clean_queue_events(float8, integer),
                              queueworker.clean_watermarks(float8, integer),
                              queueworker.clean_key_state(float8, integer),
                              queueworker.settle_dependents(bigint[]),
                              queueworker.settle_dependents(bigint[], bigint[]),
                              queueworker.count_run_outcomes(bigint[], bigint[], integer[], text[], text[])
        TO queueworker_worker;
    -- Periodic tasks (migration 011): the cron duty writes the schedules declared in code
    -- (UPSERT_CODE_CRON_JOB), reads those due (DUE_CRON_JOBS), and moves a schedule's next slot on
    -- together with enqueueing its slots (ENQUEUE_CRON_SLOTS, through queueworker.enqueue_tasks, which
    -- takes the schedule's task key since version 18; workers of earlier versions call the version without).
    GRANT SELECT, INSERT, UPDATE ON queueworker.cron_jobs TO queueworker_worker;
    GRANT EXECUTE ON FUNCTION
            queueworker.enqueue_tasks(text[], text[], jsonb[], integer[], timestamptz[], integer[], integer[],
                                      text[], boolean[], boolean[], bigint[], bigint[], bigint[], integer[]),
            queueworker.enqueue_tasks(text[], text[], jsonb[], integer[], timestamptz[], integer[], integer[],
                                      text[], boolean[], boolean[], bigint[], bigint[], bigint[], integer[], jsonb[],
                                      text[])
        TO queueworker_worker;

    -- Controller (QUEUE_DEPTH, WORKER_LEASES): counts and leases, never payloads; a queue's
    -- flow control, which bounds what scaling can do.
    GRANT SELECT (id, queue, state, delayed, priority, run_after, lease_owner, started_at, finished_at)
        ON queueworker.tasks TO queueworker_controller;
    GRANT SELECT (id, pod_name, pod_namespace, queues, running, draining)
        ON queueworker.workers TO queueworker_controller;
    GRANT SELECT ON queueworker.queues TO queueworker_controller;
    -- What a key-limited queue's keys let run (QUEUE_DEPTH's LimitedByKeys): counts from the definer
    -- function queueworker.key_capacity, so the controller never reads the keys themselves.
    GRANT EXECUTE ON FUNCTION queueworker.key_capacity(text, integer, float8) TO queueworker_controller;

    -- Operator (STATUS_COUNTS, OLDEST_PENDING_AGE, LIVE_WORKERS, TASK_STATES, RETRY_TASK, RUNS,
    -- RUN, RUN_TASKS, RUN_EVENTS, RETRY_RUN, FINALIZE_RUN (through queueworker.finalize_run),
    -- CANCEL_TASKS): reads everything, changes only what retry and cancel set. Its changes are
    -- audited by the update trigger.
    GRANT SELECT ON ALL TABLES IN SCHEMA queueworker TO queueworker_operator;
    GRANT EXECUTE ON FUNCTION queueworker.finalize_run(bigint) TO queueworker_operator;
    -- pause, resume, limit and breaker (PAUSE_QUEUE, RESUME_QUEUE, LIMIT_QUEUE, BREAKER_QUEUE).
    GRANT INSERT, UPDATE ON queueworker.queues TO queueworker_operator;
    -- A key's weight (`limit Q --key K --weight W`, `--clear`: SET_KEY_WEIGHT, CLEAR_KEY_WEIGHT; schema
    -- version 20). Tags (tasks.fair_tag) are written by the owner's triggers
    -- (migrations/functions/75_fair_share.sql), which overwrite what a row came with: producers and
    -- operators cannot write them (no column grant of theirs names them; the worker, trusted with
    -- the claim, holds UPDATE on tasks and negates a claimed task's tag). queueworker.tag_fair, queueworker.fair_tag_inserts,
    -- queueworker.fair_tag_updates and queueworker.audit_queue_key (which audits a weight's change
    -- in queue_events) need no grant: only triggers call them.
    GRANT INSERT, UPDATE, DELETE ON queueworker.queue_keys TO queueworker_operator;
    -- Per-key limits and pauses (`limit Q --per-key-...`, `limit Q --key K --rate ...`, `pause Q
    -- --key K`, `resume Q --key K`: LIMIT_QUEUE, SET_KEY_LIMITS, CLEAR_KEY_LIMITS, PAUSE_KEY,
    -- RESUME_KEY; schema version 21) write queue_keys and queues (above), and start a key's bucket
    -- full again when its rate changes by emptying its columns of queueworker.key_state (schema
    -- version 22: the row keeps the key's breaker and health); `breaker Q --per-key`
    -- (KEY_BREAKER_QUEUE) closes the keys' breakers. UPDATE of those columns, nothing more there:
    -- the keys' health is written by the workers' reports alone. DELETE stays for the CLI of
    -- version 21, which starts a bucket full by deleting its row (the key's breaker closes with it,
    -- as `breaker Q --per-key` would close it).
    GRANT DELETE ON queueworker.key_state TO queueworker_operator;
    GRANT UPDATE (tokens, tokens_at, next_token_at, breaker_state, breaker_changed_at)
        ON queueworker.key_state TO queueworker_operator;
    GRANT EXECUTE ON FUNCTION queueworker.wake_queue(text, timestamptz) TO queueworker_operator;
    GRANT UPDATE (state, delayed, run_after, max_attempts, lease_owner, leased_until, deadline_at, updated_at,
                  finished_at, error)
        ON queueworker.tasks TO queueworker_operator;
    -- `queueworker cron add`, `pause`, `resume`, `delete` (UPSERT_RUNTIME_CRON_JOB, PAUSE_CRON_JOB,
    -- RESUME_CRON_JOB, DELETE_CRON_JOB).
    GRANT INSERT, UPDATE, DELETE ON queueworker.cron_jobs TO queueworker_operator;
END
$$;
