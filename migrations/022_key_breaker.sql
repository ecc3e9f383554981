-- queueworker schema, version 22: a circuit breaker per key, and each key's health (docs/flow-control.md).
--
-- Settings, the operator's (`breaker Q --per-key --failures N --cooldown D`): on the queue's row of
-- `queueworker.queues`, `key_breaker_failures` consecutive failures of one key open that key's
-- breaker for `key_breaker_cooldown_seconds`; then one probe task of the key is claimed (half-open):
-- its success closes the breaker, its failure opens it again. They make the queue key-limited
-- (`key_limited`, and `limited`, both generated, re-made here as migration 021 did): it is claimed
-- by CLAIM_KEYS only, where a key whose breaker is open loses its turn, and the claims of earlier
-- versions take nothing from it (the trigger of migrations/functions/76_key_limits.sql).
--
-- State, per key, in `queueworker.key_state` (the tasks without a key are the key ''): the breaker
-- (`breaker_state`, `breaker_changed_at`) and the key's health, kept by the workers' reports of
-- outcomes (RECORD_KEY_OUTCOMES, worker/db/flow.sql) for every key of a key-limited queue:
-- `failure_streak` (failures since its last success), `last_success_at`, `last_failure_at`. A row
-- may now exist for a key without a bucket: `tokens` NULL is a full bucket, as no row is; an
-- operator's change of a key's rate empties those columns instead of deleting the row, so the
-- breaker and the health stay. A breaker's transition is audited in `queue_events` with the key in
-- the detail (migrations/functions/77_key_breaker.sql).
ALTER TABLE queueworker.queues
    ADD COLUMN key_breaker_failures integer CHECK (key_breaker_failures BETWEEN 1 AND 1000000),
    ADD COLUMN key_breaker_cooldown_seconds float8
        CHECK (key_breaker_cooldown_seconds > 0 AND key_breaker_cooldown_seconds <= 31536000),
    ADD CONSTRAINT queues_key_breaker_with_cooldown
        CHECK ((key_breaker_failures IS NULL) = (key_breaker_cooldown_seconds IS NULL));
-- A generated column cannot name another: both are re-made with the per-key breaker in them.
ALTER TABLE queueworker.queues DROP COLUMN limited, DROP COLUMN key_limited;
ALTER TABLE queueworker.queues
    ADD COLUMN limited boolean GENERATED ALWAYS AS (
        paused_until IS NOT NULL OR rate_per_second IS NOT NULL OR max_running IS NOT NULL
        OR breaker_failures IS NOT NULL OR key_rate_per_second IS NOT NULL OR key_max_running IS NOT NULL
        OR key_limits OR key_breaker_failures IS NOT NULL) STORED,
    ADD COLUMN key_limited boolean GENERATED ALWAYS AS (
        key_rate_per_second IS NOT NULL OR key_max_running IS NOT NULL OR key_limits
        OR key_breaker_failures IS NOT NULL) STORED;

ALTER TABLE queueworker.key_state
    ALTER COLUMN tokens DROP NOT NULL,
    ALTER COLUMN tokens_at DROP NOT NULL,
    ADD COLUMN breaker_state text NOT NULL DEFAULT 'closed' CHECK (breaker_state IN ('closed', 'open', 'half_open')),
    ADD COLUMN breaker_changed_at timestamptz,
    ADD COLUMN failure_streak integer NOT NULL DEFAULT 0 CHECK (failure_streak >= 0),
    ADD COLUMN last_success_at timestamptz,
    ADD COLUMN last_failure_at timestamptz;
-- The keys whose breaker is not closed, which a claim passes over or probes (one probe per claim)
-- and the workers count for `queueworker_key_breakers_open`.
CREATE INDEX key_state_breakers ON queueworker.key_state (queue, key) WHERE breaker_state <> 'closed';
