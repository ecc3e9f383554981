-- queueworker schema, version 24: a key's bucket is charged without writing an index entry.
--
-- Every claim of a key-limited queue writes the `queueworker.key_state` row of each key it charges
-- (`tokens`, `tokens_at`), and every report of outcomes the row of each key it reports
-- (`last_success_at`, `last_failure_at`). Version 23's index of a key's last activity was built on
-- those very columns, so none of these updates could be a heap-only (HOT) update: each wrote a new
-- entry into every index of the table, and the primary key every claim probes grew with dead entries
-- between vacuums.
--
-- The retention's index now reads `active_minute`, a stored generated column holding the minute of
-- the key's last activity: a claim or a report changes it at most once a minute per key, so the
-- others are HOT updates, with room kept on each page for them (`fillfactor`). The cleaner reads the
-- index for the keys whose minute is at or before its cutoff's, then compares the exact times
-- (queueworker.clean_key_state, migrations/functions/80_retention.sql). No activity (a row whose
-- bucket an operator emptied and whose breaker never moved) is minute 0, older than any cutoff, as
-- version 23's '-infinity' was; the times are the database's own `now()`, never infinite, and an
-- infinite one would count as no activity (-infinity) or as activity at the end of time (infinity).
ALTER TABLE queueworker.key_state SET (fillfactor = 50);
DROP INDEX queueworker.key_state_last_active;
ALTER TABLE queueworker.key_state ADD COLUMN active_minute bigint GENERATED ALWAYS AS (
    CASE WHEN greatest(tokens_at, breaker_changed_at, last_success_at, last_failure_at) IS NULL
              OR greatest(tokens_at, breaker_changed_at, last_success_at, last_failure_at) = '-infinity' THEN 0
         WHEN greatest(tokens_at, breaker_changed_at, last_success_at, last_failure_at) = 'infinity'
              THEN 9223372036854775807
         ELSE floor(extract(epoch FROM greatest(tokens_at, breaker_changed_at, last_success_at, last_failure_at)
                                       - timestamptz '1970-01-01 00:00:00+00') / 60)::bigint
    END) STORED;
CREATE INDEX key_state_active_minute ON queueworker.key_state (active_minute);
