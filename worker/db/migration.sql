-- What `queueworker migrate` runs around the migrations themselves (queueworker.db.migrate): its
-- bookkeeping tables, its lock, its lock timeouts, and what it says when a lock is held too long.
-- Each statement is declared, with its parameter and row types, in queueworker/db/migration.py.

-- name: create_migrations_table
-- The schema is created only when missing: `CREATE SCHEMA IF NOT EXISTS` needs CREATE on the
-- database even when the schema exists, which a migrator role that owns only the schema lacks
-- (docs/database-roles.sql creates the schema for it). `schema_migrations` records the versioned
-- migrations applied; `schema_functions` the function files (migrations/functions/) as last applied.
DO $$
BEGIN
    IF to_regnamespace('queueworker') IS NULL THEN
        CREATE SCHEMA queueworker;
    END IF;
END
$$;
CREATE TABLE IF NOT EXISTS queueworker.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS queueworker.schema_functions (
    name       text PRIMARY KEY,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: lock_migrations
-- Taken by a transaction of its own that holds it for a whole migrate run (its commit or rollback
-- ends it, so a transaction pooler never keeps it behind): idle between statements, and not to be
-- ended for it. A table lock, not an advisory key: only a role that may change the table (the
-- migrator) can take it, where any login could hold an advisory key forever. SHARE UPDATE
-- EXCLUSIVE conflicts with itself and not with the reads and inserts of the migration run; NOWAIT
-- fails at once (SQLSTATE 55P03) while another run holds it.
SELECT set_config('idle_in_transaction_session_timeout', '0', true);
LOCK TABLE queueworker.schema_migrations IN SHARE UPDATE EXCLUSIVE MODE NOWAIT;

-- name: set_lock_timeout
-- SET LOCAL, with a parameter: how long a migration's statements wait for a lock before giving up.
SELECT set_config('lock_timeout', %(lock_timeout)s, true);

-- name: lock_holders
-- Other sessions holding locks on queueworker's tables, oldest transaction first: who a migration
-- that timed out waiting for a lock was most likely waiting for. What the migrator may not see of
-- other users' sessions (state, transaction age) comes back NULL. The migration lock itself (on
-- schema_migrations, held by the run's other connection) is no one's obstacle and not named.
SELECT a.pid, a.usename::text AS user_name, a.application_name, a.state,
       extract(epoch FROM now() - a.xact_start)::float8 AS transaction_seconds,
       string_agg(DISTINCT l.mode || ' on ' || l.relation::regclass::text, ', ') AS locks
FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.granted AND l.locktype = 'relation' AND l.pid <> pg_backend_pid()
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.relation IN (SELECT oid FROM pg_class WHERE relnamespace = to_regnamespace('queueworker'))
  AND l.relation <> to_regclass('queueworker.schema_migrations')
GROUP BY a.pid, a.usename, a.application_name, a.state, a.xact_start
ORDER BY a.xact_start NULLS LAST
LIMIT %(limit)s;

-- name: applied_migrations
SELECT version, name, checksum FROM queueworker.schema_migrations ORDER BY version;

-- name: record_migration
INSERT INTO queueworker.schema_migrations (version, name, checksum)
VALUES (%(version)s, %(name)s, %(checksum)s);

-- name: update_migration_checksum
-- A migration rewritten since it was applied, whose recorded checksum is a known earlier text's.
UPDATE queueworker.schema_migrations SET checksum = %(checksum)s
WHERE version = %(version)s AND checksum = %(superseded)s;

-- name: applied_functions
SELECT name, checksum FROM queueworker.schema_functions ORDER BY name;

-- name: forget_functions
-- In the transaction of every versioned migration: the function files must be applied again after
-- it, even if this run stops before they are (a versioned migration may drop what they define).
DELETE FROM queueworker.schema_functions;

-- name: record_functions
-- After the function files were applied: exactly the files shipped, with their checksums.
WITH gone AS (
    DELETE FROM queueworker.schema_functions WHERE name <> ALL(%(names)s::text[])
)
INSERT INTO queueworker.schema_functions (name, checksum)
SELECT * FROM unnest(%(names)s::text[], %(checksums)s::text[])
ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now();

-- name: schema_version
SELECT coalesce(max(version), 0) AS version
FROM queueworker.schema_migrations;

-- name: schema_exists
SELECT to_regclass('queueworker.schema_migrations') IS NOT NULL AS exists;
