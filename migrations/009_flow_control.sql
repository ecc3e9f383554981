-- queueworker schema, version 9: flow control per queue, stored in Postgres and changed at runtime.
--
-- A row of `queueworker.queues` exists only for a queue with a setting: paused (until a time, or
-- 'infinity' until resumed), a rate limit (a token bucket: `rate_per_second`, at most `burst`
-- tokens), a global cap on running tasks (`max_running`, across every worker), or a circuit
-- breaker (`breaker_failures` consecutive failures open it for `breaker_cooldown_seconds`, then
-- one probe task runs; its success closes it, its failure opens it again). Claims of such a queue
-- go through CLAIM_LIMITED, which locks the row, so limits hold exactly however many workers
-- claim; queues without a row keep the plain CLAIM, which steps aside (claims nothing) for a queue
-- that has one. Every change of a setting or of the breaker's state is audited in
-- `queueworker.queue_events` (who, what, the row after) by a trigger: its function
-- `queueworker.audit_queue` is in migrations/functions/70_flow_control.sql.

CREATE TABLE queueworker.queues (
    name                     text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    paused_until             timestamptz,
    rate_per_second          float8 CHECK (rate_per_second > 0 AND rate_per_second <= 1e6),
    burst                    integer CHECK (burst BETWEEN 1 AND 1000000),
    tokens                   float8 NOT NULL DEFAULT 0,
    tokens_at                timestamptz NOT NULL DEFAULT now(),
    max_running              integer CHECK (max_running BETWEEN 1 AND 1000000),
    breaker_failures         integer CHECK (breaker_failures BETWEEN 1 AND 1000000),
    breaker_cooldown_seconds float8 CHECK (breaker_cooldown_seconds > 0 AND breaker_cooldown_seconds <= 31536000),
    breaker_state            text NOT NULL DEFAULT 'closed' CHECK (breaker_state IN ('closed', 'open', 'half_open')),
    consecutive_failures     integer NOT NULL DEFAULT 0,
    breaker_changed_at       timestamptz,
    updated_at               timestamptz NOT NULL DEFAULT now(),
    limited                  boolean GENERATED ALWAYS AS (paused_until IS NOT NULL OR rate_per_second IS NOT NULL
                                                          OR max_running IS NOT NULL OR breaker_failures IS NOT NULL)
                                                          STORED,
    CHECK ((rate_per_second IS NULL) = (burst IS NULL)),
    CHECK ((breaker_failures IS NULL) = (breaker_cooldown_seconds IS NULL))
);

CREATE TABLE queueworker.queue_events (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue   text NOT NULL,
    change  text NOT NULL,   -- paused, resumed, limits, cleared, breaker_open, breaker_half_open, breaker_closed
    detail  jsonb NOT NULL,  -- the settings after the change
    by_user text NOT NULL DEFAULT session_user,
    at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX queue_events_queue ON queueworker.queue_events (queue, id);
