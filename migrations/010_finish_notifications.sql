-- queueworker schema, version 10: a notification when a task finishes, for those that ask.
--
-- A task enqueued with `notify_on_finish` sends `pg_notify('queueworker_finished', id)` when it
-- ends succeeded, failed or cancelled, so `queueworker.wait_for` wakes at once instead of polling.
-- Only such tasks pay for it: the success statements notify from their own rows, and every other
-- way a task ends (a failure, a rescue, a cancel, a cascade) goes through this statement trigger.

ALTER TABLE queueworker.tasks ADD COLUMN notify_on_finish boolean NOT NULL DEFAULT false;

CREATE FUNCTION queueworker.notify_finished() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_catalog.pg_notify('queueworker_finished', n.id::text)
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.notify_on_finish AND n.state IN ('succeeded', 'failed', 'cancelled')
      AND n.state IS DISTINCT FROM o.state;
    RETURN NULL;
END
$$;

CREATE TRIGGER tasks_notify_finished AFTER UPDATE ON queueworker.tasks
    REFERENCING NEW TABLE AS new_rows OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION queueworker.notify_finished();

REVOKE EXECUTE ON FUNCTION queueworker.notify_finished() FROM PUBLIC;
