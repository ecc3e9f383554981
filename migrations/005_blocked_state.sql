-- queueworker schema, version 5: the `blocked` state, for a task waiting on its prerequisites.
-- A migration of its own: Postgres does not let a transaction use an enum value it added.

ALTER TYPE queueworker.task_state ADD VALUE 'blocked';
