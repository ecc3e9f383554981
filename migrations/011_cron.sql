-- queueworker schema, version 11: periodic tasks (cron).
--
-- One row per schedule, declared in code (`periodic`, `@task(cron=...)`: upserted by every worker
-- at start, source 'code') or at runtime (`queueworker cron add`: source 'runtime'). `next_slot`
-- is the first slot not yet handled. A worker's cron duty enqueues a slot in the statement that
-- moves `next_slot` on, and only if `next_slot` still holds the value it read (compare-and-set):
-- of several workers that see the same slot, exactly one moves it on and enqueues its task
-- (docs/cron.md). The slot's task carries the dedupe key 'cron:NAME:<slot, ISO 8601 UTC>'.

CREATE TABLE queueworker.cron_jobs (
    name text PRIMARY KEY CONSTRAINT cron_name_length CHECK (length(name) BETWEEN 1 AND 200),
    expression text NOT NULL CONSTRAINT cron_expression_length CHECK (length(expression) BETWEEN 1 AND 200),
    timezone text NOT NULL DEFAULT 'UTC' CONSTRAINT cron_timezone_length CHECK (length(timezone) BETWEEN 1 AND 100),
    task text NOT NULL CONSTRAINT cron_task_length CHECK (length(task) BETWEEN 1 AND 200),
    payload jsonb NOT NULL DEFAULT '{}',
    queue text NOT NULL DEFAULT 'default',
    priority integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL DEFAULT 10 CONSTRAINT cron_max_attempts CHECK (max_attempts BETWEEN 1 AND 1000),
    catch_up text NOT NULL DEFAULT 'none' CONSTRAINT cron_catch_up CHECK (catch_up IN ('none', 'latest', 'all')),
    paused boolean NOT NULL DEFAULT false,
    source text NOT NULL CONSTRAINT cron_source CHECK (source IN ('code', 'runtime')),
    next_slot timestamptz NOT NULL,
    last_enqueued_slot timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The duty's question, asked by every worker every few seconds: which schedules are due soon.
CREATE INDEX cron_jobs_due ON queueworker.cron_jobs (next_slot) WHERE NOT paused;
