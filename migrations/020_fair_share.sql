-- queueworker schema, version 20: fair share across the keys of a queue (docs/flow-control.md).
--
-- Start-time fair queueing. A queue becomes *keyed* when its first task with a key arrives
-- (`queues.keyed`, set by the insert trigger of migrations/functions/75_fair_share.sql, which also
-- tags the queue's backlog then). From then on every task of the queue that becomes claimable
-- (pending and not delayed: enqueued due now, promoted when due, retried, rescued, released,
-- settled, continued) gets a virtual start tag, `fair_tag`, from the statement triggers of that
-- file: max(the queue's virtual time, the key's last pending tag) + 1/weight, counting on within a
-- statement. Each priority is a fair queue of its own: the queue's virtual time at a priority is
-- the smallest tag waiting at that priority (one probe of `tasks_fair`), the key's last tag the
-- largest among its tasks waiting at that priority (one probe of `tasks_fair_key`): both are read, so no enqueue and no claim writes a row shared with others,
-- and nothing is kept per key but the operator's weights. Tasks without a key are one key of
-- their own (key NULL, weight 1).
--
-- The claim of a keyed queue (CLAIM_FAIR, CLAIM_LIMITED_FAIR in worker/db/lease.sql) orders by
-- (priority DESC, fair_tag, id) over `tasks_fair`: one index scan whatever the number of keys, as
-- the plain claim's over `tasks_claim`. A queue no task with a key ever reached keeps the plain
-- CLAIM, its index and its cost: its tasks have no tag and are in no new index. The plain CLAIM
-- steps aside for a keyed queue (`NOT (limited OR keyed)`, the same probe of this table as before),
-- so a worker that has not heard of the change yet claims nothing out of turn.
ALTER TABLE queueworker.tasks ADD COLUMN fair_tag float8;

ALTER TABLE queueworker.queues ADD COLUMN keyed boolean NOT NULL DEFAULT false;

-- Weights per key (`queueworker limit Q --key K --weight W`): a key with weight W takes W claims
-- per turn (its tags advance by 1/W). A row exists only for a key with a setting; per-key limits
-- build on this table.
CREATE TABLE queueworker.queue_keys (
    queue      text NOT NULL CHECK (length(queue) BETWEEN 1 AND 200),
    key        text NOT NULL
        CONSTRAINT queue_keys_key_text
        CHECK (length(key) BETWEEN 1 AND 256 AND key !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]'),
    weight     float8 NOT NULL CHECK (weight >= 0.001 AND weight <= 1000),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, key)
);

-- Only the tagged rows (those of keyed queues) are in these indexes: a queue without keys pays
-- nothing for them.
CREATE INDEX tasks_fair ON queueworker.tasks_active (queue, priority DESC, fair_tag, id)
    WHERE state = 'pending' AND NOT delayed AND fair_tag IS NOT NULL;
CREATE INDEX tasks_fair_key ON queueworker.tasks_active (queue, key, priority, fair_tag)
    WHERE state = 'pending' AND NOT delayed AND fair_tag IS NOT NULL;

-- Whether any queue is keyed, and which: one probe for every statement that could tag tasks.
CREATE INDEX queues_keyed ON queueworker.queues (name) WHERE keyed;
