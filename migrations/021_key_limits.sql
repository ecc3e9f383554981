-- queueworker schema, version 21: per-key limits and per-key pause (docs/flow-control.md).
--
-- Settings, the operator's (audited in queue_events by the triggers of migrations/functions/70_flow_control.sql
-- and 75_fair_share.sql; the other triggers they need are in 76_key_limits.sql):
-- - defaults for every key of a queue, on its row of `queueworker.queues`: `key_rate_per_second`
--   with `key_burst` (a token bucket per key) and `key_max_running` (running tasks per key); the
--   tasks without a key count as one key;
-- - overrides for one key, on its row of `queueworker.queue_keys` (which held only weights): a rate
--   and burst, a cap, a pause (`paused_until`, 'infinity' until resumed). A row exists only for a
--   key with a setting; the weight is NULL (1) when only limits are set.
-- A queue with any of them is *key-limited*: `key_limited`, and `limited` too (both generated;
-- `key_limits` is kept by the trigger on queue_keys: some key of the queue has a limit or a pause
-- of its own). It is keyed (its backlog tagged, fair order) from the moment it is key-limited, and
-- claimed by CLAIM_KEYS only (worker/db/lease.sql), under the queue's row lock.
--
-- State, the claim's: `queueworker.key_state` holds each key's bucket (tokens at tokens_at, and
-- `next_token_at`, when it has a whole token again, NULL while it has one), written by CLAIM_KEYS
-- for the keys it claimed from; a key without a row has a full bucket. The tasks without a key are
-- the key '' there (no task key is empty: migration 018). Room is left for a per-key breaker and
-- key health (columns of this table, later).
--
-- A running task of a keyed queue claimed by this version keeps its tag, negated (tags are
-- positive): the running tasks per key are counted from `tasks_running_keys`, which holds keyed
-- queues' running tasks only, and a claim of an earlier version (which clears the tag, or keeps it
-- positive) is told apart by the row trigger of 76_key_limits.sql, which skips the rows such a
-- claim would take from a key-limited queue.
ALTER TABLE queueworker.queue_keys
    ALTER COLUMN weight DROP NOT NULL,
    ADD COLUMN rate_per_second float8 CHECK (rate_per_second > 0 AND rate_per_second <= 1e6),
    ADD COLUMN burst integer CHECK (burst BETWEEN 1 AND 1000000),
    ADD COLUMN max_running integer CHECK (max_running BETWEEN 1 AND 1000000),
    ADD COLUMN paused_until timestamptz,
    ADD CONSTRAINT queue_keys_burst_with_rate CHECK ((rate_per_second IS NULL) = (burst IS NULL)),
    ADD CONSTRAINT queue_keys_some_setting
        CHECK (weight IS NOT NULL OR rate_per_second IS NOT NULL OR max_running IS NOT NULL
               OR paused_until IS NOT NULL);
-- The pauses whose time has passed, which LOCK_KEYS ends (one probe per claim of the queue).
CREATE INDEX queue_keys_paused ON queueworker.queue_keys (queue, paused_until) WHERE paused_until IS NOT NULL;

ALTER TABLE queueworker.queues
    ADD COLUMN key_rate_per_second float8 CHECK (key_rate_per_second > 0 AND key_rate_per_second <= 1e6),
    ADD COLUMN key_burst integer CHECK (key_burst BETWEEN 1 AND 1000000),
    ADD COLUMN key_max_running integer CHECK (key_max_running BETWEEN 1 AND 1000000),
    ADD COLUMN key_limits boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT queues_key_burst_with_rate CHECK ((key_rate_per_second IS NULL) = (key_burst IS NULL));
-- A generated column cannot name another: `limited` is re-made with the key settings in it (the
-- table is small; nothing but statements and functions, resolved when they run, reads it).
ALTER TABLE queueworker.queues DROP COLUMN limited;
ALTER TABLE queueworker.queues
    ADD COLUMN limited boolean GENERATED ALWAYS AS (
        paused_until IS NOT NULL OR rate_per_second IS NOT NULL OR max_running IS NOT NULL
        OR breaker_failures IS NOT NULL OR key_rate_per_second IS NOT NULL OR key_max_running IS NOT NULL
        OR key_limits) STORED,
    ADD COLUMN key_limited boolean GENERATED ALWAYS AS (
        key_rate_per_second IS NOT NULL OR key_max_running IS NOT NULL OR key_limits) STORED;

CREATE TABLE queueworker.key_state (
    queue         text NOT NULL,
    key           text NOT NULL,  -- '' for the tasks without a key
    tokens        float8 NOT NULL,
    tokens_at     timestamptz NOT NULL,
    next_token_at timestamptz,
    PRIMARY KEY (queue, key)
);
-- The keys out of tokens, which a claim of a key-limited queue passes over.
CREATE INDEX key_state_waiting ON queueworker.key_state (queue, next_token_at) WHERE next_token_at IS NOT NULL;

-- Running tasks per key of keyed queues: what a claim of a key-limited queue counts (O(running)).
-- Plain queues' tasks have no tag and are not in it.
CREATE INDEX tasks_running_keys ON queueworker.tasks_active (queue, key)
    WHERE state = 'running' AND fair_tag IS NOT NULL;
