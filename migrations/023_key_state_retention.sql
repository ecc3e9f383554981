-- queueworker schema, version 23: retention of the keys' state (docs/flow-control.md, "Forgetting
-- idle keys").
--
-- `queueworker.key_state` holds a row per key a claim charged or a report reached (its bucket, its
-- breaker, its health), and nothing deleted them: a scraper over millions of short-lived keys grew
-- it forever. The cleaner now deletes the rows of keys idle for the retention (no unfinished task,
-- no change to the row for `--retention-hours`), through the definer function
-- queueworker.clean_key_state (migrations/functions/80_retention.sql), which takes a row of
-- `duty_locks` of its own, so one worker at a time does it.
INSERT INTO queueworker.duty_locks (duty) VALUES ('clean_key_state');

-- A key's last activity, the latest of its row's times (none: never, a row whose bucket an operator
-- emptied and whose breaker never moved). The idle keys, oldest first, in batches: without it every
-- pass would read the whole table, one row per key ever seen.
CREATE INDEX key_state_last_active ON queueworker.key_state (
    (coalesce(greatest(tokens_at, breaker_changed_at, last_success_at, last_failure_at), '-infinity'::timestamptz)));

-- Whether a key has an unfinished task (pending, delayed, running, retrying or blocked): one probe per
-- idle key the cleaner considers. The keyed tasks only: a queue's tasks without a key (the key ''
-- of key_state, one row per queue) are not looked for, and keep their row.
CREATE INDEX tasks_active_keys ON queueworker.tasks_active (queue, key) WHERE key IS NOT NULL;
