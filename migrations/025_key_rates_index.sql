-- queueworker schema, version 25: the fastest per-key rate of a queue in one probe.
--
-- Every worker of a key-limited queue reads, at each refresh of its flow-control settings (every
-- 5 seconds while a queue it serves has flow control: LIMITED_QUEUES, worker/db/flow.sql), the
-- fastest rate among the keys' own settings: how soon a claim cut short by a key's bucket is worth
-- trying again. That was a read of every key with settings of its own (queue_keys, through its
-- primary key): 11.5 ms at 100,000 keys with a rate of their own, per worker and refresh. This index
-- answers it with one probe; only an operator's change of a key's settings writes it.
CREATE INDEX queue_keys_rates ON queueworker.queue_keys (queue, rate_per_second) WHERE rate_per_second IS NOT NULL;
