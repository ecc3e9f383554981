"""Migrations never stall the queue behind a lock: each runs under a lock_timeout and retries.

A migration's ALTER TABLE waits for an ACCESS EXCLUSIVE lock behind any open transaction that
read the table, and every statement that comes later queues behind that waiting lock. These
tests hold such a transaction open for real (migration 002 renames `queueworker.tasks`, so a
database at version 1 has a real migration that needs that lock).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from queueworker.localpg import free_port
from queueworker.migrate import MAX_RETRY_WAIT_SECONDS, LockPolicy, available_migrations, migrate
from queueworker.producer import enqueue
from tests.schema_history import migrate_to
from tests.support import query, scalar, wait_until

BLOCKER = "long-report"


def _at_version_1(dsn: str) -> list[int]:
    """The database as migration 001 left it, with a few tasks; returns their ids."""
    migrate_to(dsn, 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [enqueue(conn, "qw.noop") for _ in range(3)]


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
