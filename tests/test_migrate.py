"""Migrations never stall the queue behind a lock: each runs under a lock_timeout and retries.

A migration's ALTER TABLE waits for an ACCESS EXCLUSIVE lock behind any open transaction that
read the table, and every statement that comes later queues behind that waiting lock. These
tests hold such a transaction open for real (migration 002 renames `queueworker.tasks`, so a
database at version 1 has a real migration that needs that lock).

And the function files (migrations/functions/): databases migrated before they existed (0.1.0 at
version 10, main at 12, and the unreleased versions before) are built from the migrations as they
stood then (tests/schema_history.py) and upgraded for real, to the schema a fresh database has;
afterwards a run with nothing to do does no DDL, and a changed file is applied again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.types.json import Jsonb

from queueworker.db import migrate as migrate_module
from queueworker.dev import schema_snapshot
from queueworker.db import migration, statements
from queueworker.dev.localpg import find_bin_dir, free_port
from queueworker.db.migrate import (
    MAX_RETRY_WAIT_SECONDS, SUPERSEDED_CHECKSUMS, LockPolicy, Migration, MigrationBlocked, available_functions,
    available_migrations, migrate,
)
from queueworker.client.producer import enqueue
from tests.schema_history import HISTORY, history, migrate_to
from tests.support import query, scalar, wait_until

BLOCKER = "long-report"


def _at_version_1(dsn: str) -> list[int]:
    """The database as migration 001 left it, with a few tasks; returns their ids."""
    migrate_to(dsn, 1)
    with psycopg.connect(dsn, autocommit=True) as conn:  # inserted as that version's producer did
        return [row[0] for row in conn.execute("INSERT INTO queueworker.tasks (queue, task) "
                                               "SELECT 'default', 'qw.noop' FROM generate_series(1, 3) "
                                               "RETURNING id").fetchall()]


def _open_transaction_that_read_tasks(dsn: str) -> psycopg.Connection:
    """An application transaction left open after reading the queue: it holds ACCESS SHARE on
    queueworker.tasks until it ends."""
    conn = psycopg.connect(dsn, application_name=BLOCKER)
    conn.execute("SELECT count(*) FROM queueworker.tasks")
    return conn


def _migrator_waits_for_a_table_lock(dsn: str) -> bool:
    return scalar(dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'queueworker-migrate' "
                       "AND wait_event_type = 'Lock' AND wait_event = 'relation'") == 1


def _run_cli_migrate(dsn: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queueworker.cli", "migrate", "--dsn", dsn],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **env})


@pytest.mark.integration
def test_a_migration_behind_a_long_transaction_lets_the_queue_through_and_applies_once_it_ends(blank_dsn, caplog):
    ids = _at_version_1(blank_dsn)
    blocker = _open_transaction_that_read_tasks(blank_dsn)
    policy = LockPolicy(lock_timeout_seconds=2, budget_seconds=120)
    caplog.set_level(logging.WARNING, logger="queueworker.migrate")
    with ThreadPoolExecutor(2) as pool:
        # Two migrators at once: the second waits on the advisory lock, the first on the table.
        runs = [pool.submit(migrate, blank_dsn, policy) for _ in range(2)]
        try:  # the blocker ends before the pool waits for the migrators, whatever happens
            wait_until(lambda: _migrator_waits_for_a_table_lock(blank_dsn), timeout=20,
                       message="a migrator waiting for its lock on queueworker.tasks")
            # A reader arriving now queues behind the migrator's ACCESS EXCLUSIVE request. It gets
            # through once that request times out, while the long transaction is still open; without
            # the lock_timeout it would wait for that transaction and hit its statement_timeout.
            with psycopg.connect(blank_dsn, autocommit=True, options="-c statement_timeout=20000") as reader:
                assert reader.execute("SELECT count(*) FROM queueworker.tasks").fetchone() == (len(ids),)
            assert not blocker.closed and blocker.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            wait_until(lambda: any("rolled back, retrying" in r.getMessage() for r in caplog.records), timeout=20,
                       message="the migrator to give up one attempt and retry")
            blocker.commit()
        finally:
            blocker.close()
        applied = sorted(([m.version for m in run.result(timeout=60)] for run in runs), key=len)
    assert applied == [[], [m.version for m in available_migrations()[1:]]], "exactly one migrator applied them"
    retry = next(r.getMessage() for r in caplog.records if "rolled back, retrying" in r.getMessage())
    assert "migration 002_partition_finished" in retry and f"application '{BLOCKER}'" in retry, retry
    assert sorted(r[0] for r in query(blank_dsn, "SELECT id FROM queueworker.tasks")) == ids
    assert scalar(blank_dsn, "SELECT max(version) FROM queueworker.schema_migrations") == \
        available_migrations()[-1].version


@pytest.mark.integration
def test_migrate_gives_up_with_one_clear_line_when_the_transaction_never_ends(blank_dsn):
    ids = _at_version_1(blank_dsn)
    blocker = _open_transaction_that_read_tasks(blank_dsn)
    try:
        result = _run_cli_migrate(blank_dsn, QUEUEWORKER_MIGRATE_LOCK_TIMEOUT="0.5",
                                  QUEUEWORKER_MIGRATE_LOCK_BUDGET="3")
        blocker_pid = blocker.info.backend_pid
    finally:
        blocker.close()
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("queueworker: database error: migration 002_partition_finished could not get its "
                           "locks within 3 s"), last
    assert f"pid {blocker_pid} (user postgres, application '{BLOCKER}', idle in transaction" in last, last
    assert "AccessShareLock on queueworker.tasks" in last and "rolled back" in last, last
    password = psycopg.conninfo.conninfo_to_dict(blank_dsn).get("password")
    assert password and password not in result.stderr + result.stdout
    # Nothing half-done: still version 1, every task where it was.
    assert scalar(blank_dsn, "SELECT max(version) FROM queueworker.schema_migrations") == 1
    assert sorted(r[0] for r in query(blank_dsn, "SELECT id FROM queueworker.tasks")) == ids
    assert scalar(blank_dsn, "SELECT to_regclass('queueworker.tasks_active')") is None
    assert _run_cli_migrate(blank_dsn).returncode == 0


@pytest.mark.parametrize("value, problem", [("abc", "valid number"), ("0", "greater than 0"),
                                            ("31", "less than or equal to 30")])
def test_a_bad_lock_setting_is_one_clear_line(value, problem):
    """Checked before connecting: no database needed to be told."""
    result = _run_cli_migrate(f"postgresql://nobody@127.0.0.1:{free_port()}/x",
                              QUEUEWORKER_MIGRATE_LOCK_TIMEOUT=value)
    assert result.returncode == 2, result
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("queueworker: invalid input: QUEUEWORKER_MIGRATE_LOCK_TIMEOUT: ") and problem in line


def test_waits_between_attempts_back_off_with_jitter_and_let_the_queue_drain():
    policy = LockPolicy(lock_timeout_seconds=2)
    for attempt in range(1, 12):
        ceiling = min(MAX_RETRY_WAIT_SECONDS, 2.0 * 2 ** (attempt - 1))
        waits = {policy.retry_wait(attempt) for _ in range(50)}
        assert all(ceiling / 2 <= wait <= ceiling for wait in waits), (attempt, waits)
        assert len(waits) > 1, "jittered"
    assert LockPolicy.from_environment({"QUEUEWORKER_MIGRATE_LOCK_TIMEOUT": "0.25", "PATH": "/bin"}) == \
        LockPolicy(lock_timeout_seconds=0.25)


# -- function files and upgrades from databases migrated before they existed ------------------------

# What a database holds that an upgrade must keep: every table with rows of its own (the partitions
# through their parent), ordered by key.
_CONTENTS = {"tasks": "id", "task_events": "id", "task_dependencies": "prerequisite_id, task_id", "runs": "id",
             "run_events": "id", "watermarks": "name", "queues": "name", "queue_events": "id", "cron_jobs": "name"}


@pytest.fixture(scope="module")
def fresh_schema(postgres) -> str:
    """The schema dump of a database freshly migrated by this release."""
    server, admin_dsn = postgres
    return schema_snapshot.fresh_snapshot(admin_dsn, server.bin_dir if server else find_bin_dir())


def _schema(dsn: str, postgres) -> str:
    server, _ = postgres
    return schema_snapshot.dump(dsn, server.bin_dir if server else find_bin_dir())


def _populate(dsn: str, version: int) -> None:
    """Tasks in every state, a dependency, a run with one partition done, a paused and rate-limited
    queue and (from version 11) a cron job, written as a database of `version` took them: plain SQL
    and that version's own functions, which leave their audit rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        def insert(**columns) -> int:
            names = ", ".join(columns)
            values = ", ".join(f"%({name})s" for name in columns)
            return conn.execute(f"INSERT INTO queueworker.tasks (queue, task, delayed, {names}) "
                                f"VALUES ('q', 'qw.noop', false, {values}) RETURNING id", columns).fetchone()[0]
        pending, running, succeeded, failed, retrying, cancelled = (
            insert(payload=Jsonb({"n": n})) for n in range(6))
        conn.execute("""UPDATE queueworker.tasks SET state = 'running', attempts = 1, lease_owner = %s, lease_token = 1,
                        leased_until = now() + interval '1 minute', deadline_at = now() + interval '1 hour',
                        started_at = now() WHERE id = %s""", (uuid.uuid4(), running))
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', result = '{\"ok\": true}', finished_at = now() "
                     "WHERE id = %s", (succeeded,))
        conn.execute("UPDATE queueworker.tasks SET state = 'failed', error = '{\"type\": \"E\", \"message\": \"boom\"}', "
                     "finished_at = now() WHERE id = %s", (failed,))
        conn.execute("UPDATE queueworker.tasks SET state = 'retrying', run_after = now() + interval '1 hour', "
                     "error = '{\"type\": \"E\", \"message\": \"again\"}' WHERE id = %s", (retrying,))
        conn.execute("UPDATE queueworker.tasks SET state = 'cancelled', finished_at = now() WHERE id = %s", (cancelled,))
        # A task blocked on the pending one, through the producer's function of the day (14 arguments).
        conn.execute("""SELECT * FROM queueworker.enqueue_tasks(
                            ARRAY['q'], ARRAY['qw.noop'], ARRAY['{}']::jsonb[], ARRAY[0], ARRAY[NULL]::timestamptz[],
                            ARRAY[10], ARRAY[NULL]::integer[], ARRAY['after-pending'], ARRAY[false], ARRAY[true],
                            ARRAY[1]::bigint[], ARRAY[%s]::bigint[], ARRAY[NULL]::bigint[], ARRAY[NULL]::integer[])""",
                     (pending,))
        run_id = conn.execute("SELECT queueworker.start_run('nightly', 2, '{\"task\": \"qw.noop\", \"queue\": \"q\"}', "
                              "NULL, 'nightly')").fetchone()[0]
        first, _ = insert(run_id=run_id, run_partition=0), insert(run_id=run_id, run_partition=1)
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() WHERE id = %s", (first,))
        conn.execute("INSERT INTO queueworker.queues (name, paused_until, rate_per_second, burst) "
                     "VALUES ('q', 'infinity', 5, 10)")
        if version >= 11:
            conn.execute("""INSERT INTO queueworker.cron_jobs (name, expression, task, source, next_slot)
                            VALUES ('hourly', '0 * * * *', 'qw.noop', 'code', date_trunc('hour', now()) + interval '1 hour')""")


def _contents(dsn: str, columns: dict[str, list[str]] | None = None) -> dict[str, tuple[list[str], list[tuple]]]:
    """Each table's rows, in the columns it has (or the given ones: those it had before an upgrade)."""
    found = {}
    for table, key in _CONTENTS.items():
        if columns is not None and table not in columns:
            continue  # a table the database did not have before (cron_jobs, before version 11)
        names = columns[table] if columns else [row[0] for row in query(dsn, """
            SELECT column_name FROM information_schema.columns WHERE table_schema = 'queueworker' AND table_name = %s
            ORDER BY ordinal_position""", (table,))]
        if names:
            texts = ", ".join(f"{name}::text" for name in names)  # as text: 'infinity' is no Python datetime
            found[table] = (names, query(dsn, f"SELECT {texts} FROM queueworker.{table} ORDER BY {key}"))
    return found


def _ddl_marks(dsn: str) -> list[tuple]:
    """What any DDL on queueworker's functions and triggers changes: a function's row version (a
    CREATE OR REPLACE writes a new one) and a trigger's oid (dropped and created again: a new one)."""
    return query(dsn, """
        SELECT 'function', p.oid::regprocedure::text, p.xmin::text FROM pg_proc p
        WHERE p.pronamespace = 'queueworker'::regnamespace
        UNION ALL
        SELECT 'trigger', t.tgname || ' on ' || t.tgrelid::regclass::text, t.oid::text FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = 'queueworker'::regnamespace
        ORDER BY 1, 2""")


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "queueworker.migrate"]


@pytest.mark.integration
@pytest.mark.parametrize("version", [12, 10], ids=["main-at-version-12", "release-0.1.0-at-version-10"])
def test_a_database_migrated_before_the_function_files_upgrades_to_what_a_fresh_one_is(
        blank_dsn, postgres, fresh_schema, caplog, version):
    migrate_to(blank_dsn, version)
    _populate(blank_dsn, version)
    before = _contents(blank_dsn)
    caplog.set_level(logging.INFO, logger="queueworker.migrate")

    applied = migrate(blank_dsn)

    assert [m.version for m in applied] == [m.version for m in available_migrations()][version:]
    messages = _messages(caplog)
    assert not [m for m in messages if "changed after it was applied" in m], messages
    rewritten = sorted(v for v, checksum in SUPERSEDED_CHECKSUMS.items() if v <= version
                       and checksum != next(m.checksum for m in available_migrations() if m.version == v))
    assert [m for m in messages if "was rewritten when functions moved" in m] == [
        f"migration {m.label} was rewritten when functions moved to migrations/functions/; its recorded checksum is "
        "brought up to date" for m in available_migrations() if m.version in rewritten]
    assert len([m for m in messages if m.startswith("applied the function files")]) == 1, messages
    assert query(blank_dsn, "SELECT version, checksum FROM queueworker.schema_migrations ORDER BY version") == [
        (m.version, m.checksum) for m in available_migrations()]
    assert query(blank_dsn, "SELECT name, checksum FROM queueworker.schema_functions ORDER BY name") == [
        (f.name, f.checksum) for f in available_functions()]
    assert _contents(blank_dsn, {table: names for table, (names, _) in before.items()}) == before, \
        "rows and audit trail as they were"
    assert _schema(blank_dsn, postgres) == fresh_schema

    # The functions work as a fresh database's: the blocked task is released when its prerequisite
    # succeeds (through the update trigger), and a new task gets its audit row.
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() "
                     "WHERE payload = '{\"n\": 0}'")
        assert scalar(blank_dsn, "SELECT state::text FROM queueworker.tasks WHERE dedupe_key = 'after-pending'") \
            == "pending"
        new = enqueue(conn, "qw.noop")
    assert query(blank_dsn, "SELECT from_state, to_state::text FROM queueworker.task_events WHERE task_id = %s",
                 (new,)) == [(None, "pending")]

    # Nothing changed since: the next run applies nothing, not even the function files.
    marks = _ddl_marks(blank_dsn)
    recorded = query(blank_dsn, "SELECT name, checksum, applied_at FROM queueworker.schema_functions ORDER BY name")
    caplog.clear()
    assert migrate(blank_dsn) == []
    assert _messages(caplog) == []
    assert query(blank_dsn, "SELECT name, checksum, applied_at FROM queueworker.schema_functions ORDER BY name") \
        == recorded
    assert _ddl_marks(blank_dsn) == marks, "no function replaced, no trigger created again"


@pytest.mark.integration
@pytest.mark.parametrize("version", range(1, 12))
def test_an_empty_database_of_any_earlier_version_upgrades_to_the_schema_of_a_fresh_one(
        blank_dsn, postgres, fresh_schema, version):
    """Versions before 10 were never released; their upgrade applies versioned migrations meant for
    a schema without functions to one that still has the old ones, and must end the same."""
    migrate_to(blank_dsn, version)
    assert [m.version for m in migrate(blank_dsn)] == [m.version for m in available_migrations()][version:]
    assert _schema(blank_dsn, postgres) == fresh_schema


def test_the_superseded_checksums_are_those_of_the_migrations_as_they_stood():
    assert SUPERSEDED_CHECKSUMS == {
        m.version: hashlib.sha256((HISTORY / f"{m.label}.sql").read_bytes()).hexdigest() for m in history()}
    assert [m.version for m in history()] == list(range(1, 13))
    # Versions whose text did not change record the same checksum either way; the others moved.
    unchanged = [m.version for m in available_migrations() if SUPERSEDED_CHECKSUMS.get(m.version) == m.checksum]
    assert unchanged == [5, 8, 11]


@pytest.mark.integration
def test_a_recorded_checksum_that_is_not_the_migrations_own_earlier_text_still_warns(dsn, caplog):
    """Only a version's own superseded text is accepted quietly: another version's is a change."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE queueworker.schema_migrations SET checksum = %s WHERE version = 2",
                     (SUPERSEDED_CHECKSUMS[3],))
    caplog.set_level(logging.INFO, logger="queueworker.migrate")
    assert migrate(dsn) == []
    assert _messages(caplog) == ["migration 002_partition_finished changed after it was applied; not re-applied"]
    assert scalar(dsn, "SELECT checksum FROM queueworker.schema_migrations WHERE version = 2") == \
        SUPERSEDED_CHECKSUMS[3]


@pytest.mark.integration
@pytest.mark.parametrize("record", ["changed", "missing"])
def test_a_function_file_changed_since_it_was_applied_is_applied_again(dsn, caplog, record):
    """As after an upgrade that changed 40_dependencies.sql: what the database has (here a broken
    verdict and no settling trigger) is replaced by what the file says."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE OR REPLACE FUNCTION queueworker.dependency_verdict(waiting integer, failed integer) "
                     "RETURNS queueworker.task_state LANGUAGE sql IMMUTABLE AS 'SELECT ''pending''::queueworker.task_state'")
        conn.execute("DROP TRIGGER tasks_active_settle_new_dependent ON queueworker.tasks_active")
        if record == "changed":
            conn.execute("UPDATE queueworker.schema_functions SET checksum = 'an earlier text' "
                         "WHERE name = '40_dependencies'")
        else:
            conn.execute("DELETE FROM queueworker.schema_functions WHERE name = '40_dependencies'")
    caplog.set_level(logging.INFO, logger="queueworker.migrate")

    assert migrate(dsn) == []

    assert _messages(caplog) == [
        f"applied the function files ({', '.join(f.name for f in available_functions())}): changed or new since "
        "last applied: 40_dependencies"]
    assert scalar(dsn, "SELECT queueworker.dependency_verdict(1, 0)::text") == "blocked"
    assert scalar(dsn, "SELECT count(*) FROM pg_trigger WHERE tgname = 'tasks_active_settle_new_dependent'") == 1
    assert query(dsn, "SELECT name, checksum FROM queueworker.schema_functions ORDER BY name") == [
        (f.name, f.checksum) for f in available_functions()]


@pytest.mark.integration
def test_a_versioned_migration_has_the_function_files_applied_even_by_a_later_run(
        dsn, caplog, monkeypatch):
    """A run that applied a versioned migration and then could not apply the function files (its
    lock budget ran out) leaves them to be applied by the next run, though no file changed: the
    migration's own transaction forgot their record."""
    shipped = available_migrations()
    upcoming = Migration(shipped[-1].version + 1, "drops_a_trigger",
                         "DROP TRIGGER tasks_notify_finished ON queueworker.tasks;\n")
    monkeypatch.setattr(migrate_module, "available_migrations", lambda: [*shipped, upcoming])
    blocker = psycopg.connect(dsn, application_name=BLOCKER)
    blocker.execute("LOCK TABLE queueworker.queues IN ACCESS SHARE MODE")  # 70_flow_control's triggers wait
    try:
        with pytest.raises(MigrationBlocked, match="^migrations/functions/ could not get its locks"):
            migrate(dsn, LockPolicy(lock_timeout_seconds=0.2, budget_seconds=1))
    finally:
        blocker.close()
    assert scalar(dsn, "SELECT max(version) FROM queueworker.schema_migrations") == upcoming.version
    assert scalar(dsn, "SELECT count(*) FROM pg_trigger WHERE tgname = 'tasks_notify_finished'") == 0
    assert scalar(dsn, "SELECT count(*) FROM queueworker.schema_functions") == 0

    caplog.set_level(logging.INFO, logger="queueworker.migrate")
    assert migrate(dsn) == []
    assert scalar(dsn, "SELECT count(*) FROM pg_trigger WHERE tgname = 'tasks_notify_finished'") == 1
    assert [m for m in _messages(caplog) if m.startswith("applied the function files")]


@pytest.mark.integration
def test_a_schema_newer_than_this_release_keeps_its_functions(dsn, caplog):
    """A migrator of an earlier release (a worker started with --migrate during a rolling upgrade)
    must not put its older functions over a newer release's."""
    newer = available_migrations()[-1].version + 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        statements.execute(conn, migration.RECORD_MIGRATION, migration.RecordMigrationParams(
            version=newer, name="from_a_newer_release", checksum="x"))
        conn.execute("UPDATE queueworker.schema_functions SET checksum = 'the newer release''s text'")
    marks = _ddl_marks(dsn)
    caplog.set_level(logging.INFO, logger="queueworker.migrate")

    assert migrate(dsn) == []

    assert _messages(caplog) == [f"the schema is at version {newer}, newer than this release's {newer - 1}: its "
                                 "functions are left as that release defined them"]
    assert _ddl_marks(dsn) == marks
    assert {row[0] for row in query(dsn, "SELECT checksum FROM queueworker.schema_functions")} == \
        {"the newer release's text"}
