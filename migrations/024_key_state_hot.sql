-- queueworker schema, version 24: a key's bucket is charged without writing an index entry.
--
-- Every claim of a key-limited queue writes the `queueworker.key_state` row of each key it charges
-- (`tokens`, `tokens_at`), and every report of outcomes the row of each key it reports
-- (`last_success_at`, `last_failure_at`). Version 23's index of a key's last activity was built on
-- those very columns, so none of these updates could be a heap-only (HOT) update: each wrote a new
-- entry into every index of the table, and the primary key every claim probes grew with dead entries
-- between vacuums.
--
-- The retention's index now reads `active_minute`, a stored generated column holding the start of the
-- minute of the key's last activity: a claim or a report changes it at most once a minute per key,
-- so the others are HOT updates, with room kept on each page for them (`fillfactor`). The minute
-- starts at or before the activity, so the cleaner reads the index for the minutes before its
-- cutoff, then compares the exact times (queueworker.clean_key_state,
-- migrations/functions/80_retention.sql). No activity (a row whose bucket an operator emptied and
-- whose breaker never moved) is '-infinity', as version 23 counted it; an infinite time is itself.
-- Minutes are counted from 2000-01-01, Postgres's own origin, from which every time's distance is
-- representable.
ALTER TABLE queueworker.key_state SET (fillfactor = 50);
DROP INDEX queueworker.key_state_last_active;
ALTER TABLE queueworker.key_state ADD COLUMN active_minute timestamptz NOT NULL GENERATED ALWAYS AS (
    CASE WHEN isfinite(greatest(tokens_at, breaker_changed_at, last_success_at, last_failure_at))
         THEN date_bin('1 minute', greatest(tokens_at, breaker_changed_at, last_success_at, last_failure_at),
                       timestamptz '2000-01-01 00:00:00+00')
         ELSE coalesce(greatest(tokens_at, breaker_changed_at, last_success_at, last_failure_at), '-infinity')
    END) STORED;
CREATE INDEX key_state_active_minute ON queueworker.key_state (active_minute);
