-- queueworker schema, version 14: a queue name follows one pattern wherever it is stored.
--
-- The pattern is queueworker.names.QUEUE_PATTERN, the one the API checks: letters, digits and
-- `_.:-`, starting with a letter or digit, at most 128 characters. tasks.queue has held it since
-- version 1; queues.name was only length-checked (1 to 200), and cron_jobs.queue, workers.queues
-- and queue_events.queue not at all, so a name written past the API (by SQL, or by a release
-- before the API checked it) could hold `/`, spaces or `..`: `evil/../q2` in a console link or
-- form was a path that reached q2. Every name is now a safe path segment and query value.
--
-- Existing rows that break the pattern: for queues, cron_jobs and workers, this migration fails
-- before it changes anything, naming the offending rows (the first 20 of each table) and how to
-- fix them, instead of Postgres's bare "check constraint ... is violated by some row", and instead
-- of renaming or deleting anything itself (what a queue is called is the operator's decision: its
-- tasks and its workers' configuration name it too). The whole migration is one transaction, so a
-- refusal loses nothing and `queueworker migrate` can run again once the rows are fixed.
-- queue_events is an append-only audit trail: its past rows record what happened under the name
-- of the day and are kept as they are (the constraint is NOT VALID: it holds for every new row,
-- which audit_queue writes from queues rows that now follow the pattern).

DO $$
DECLARE
    offending text;
BEGIN
    SELECT string_agg(line, '; ') INTO offending FROM (
        (SELECT format('queues.name %L', name) AS line FROM queueworker.queues
         WHERE name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' ORDER BY name LIMIT 20)
        UNION ALL
        (SELECT format('cron_jobs %L: queue %L', name, queue) FROM queueworker.cron_jobs
         WHERE queue !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' ORDER BY name LIMIT 20)
        UNION ALL
        (SELECT format('workers %s (%s): queues %L', id, hostname, queues) FROM queueworker.workers
         WHERE EXISTS (SELECT FROM unnest(queues) AS q(name)
                       WHERE q.name IS NULL OR q.name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$')
         ORDER BY id LIMIT 20)
    ) AS found;
    IF offending IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation',
            MESSAGE = 'queue names that are not letters, digits and _.:- (at most 128, starting with a '
                      'letter or digit): ' || offending,
            HINT = 'nothing was changed; delete or rename these rows (DELETE FROM queueworker.queues WHERE name = ..., '
                   '`queueworker cron delete NAME`, stop those workers), then run `queueworker migrate` again';
    END IF;
END
$$;

ALTER TABLE queueworker.queues
    ADD CONSTRAINT queues_name_pattern CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$');
ALTER TABLE queueworker.cron_jobs
    ADD CONSTRAINT cron_jobs_queue_pattern CHECK (queue ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$');
-- No NULL element, and each element the pattern: names hold no space, so the array joined by
-- spaces splits back into exactly its elements.
ALTER TABLE queueworker.workers
    ADD CONSTRAINT workers_queues_pattern CHECK (
        array_position(queues, NULL) IS NULL
        AND (cardinality(queues) = 0
             OR array_to_string(queues, ' ')
                ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}( [A-Za-z0-9][A-Za-z0-9_.:-]{0,127})*$'));
ALTER TABLE queueworker.queue_events
    ADD CONSTRAINT queue_events_queue_pattern CHECK (queue ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$') NOT VALID;
