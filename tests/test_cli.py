"""The `queueworker` CLI: real subprocesses, real database. Bad input means one line on stderr,
a non-zero exit, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from queueworker.localpg import free_port
from tests.support import query, wait_until


def qw(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "queueworker.cli", *args], capture_output=True, text=True,
                          timeout=60, env={**{k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
                                           **(env or {})})


def _one_clear_line(result: subprocess.CompletedProcess, code: int, fragment: str) -> None:
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and fragment in lines[-1], result.stderr


def test_no_database_configured():
    _one_clear_line(qw("status"), 2, "pass --dsn or set DATABASE_URL")


def test_unreachable_database():
    dsn = f"postgresql://nobody@127.0.0.1:{free_port()}/x?connect_timeout=2"
    _one_clear_line(qw("status", "--dsn", dsn), 1, "database error")


def test_invalid_json_payload():
    _one_clear_line(qw("enqueue", "qw.noop", "--payload", "{not json", "--dsn", "postgresql://x"), 2,
                    "not valid JSON")


def test_unknown_option():
    _one_clear_line(qw("worker", "--no-such-flag"), 2, "unrecognized arguments")


@pytest.mark.integration
def test_invalid_values_are_rejected_before_anything_runs(dsn):
    _one_clear_line(qw("enqueue", "qw.noop", "--queue", "bad queue", "--dsn", dsn), 2, "queue")
    _one_clear_line(qw("worker", "--lease-seconds", "4", "--dsn", dsn), 2, "at most half the lease")
    _one_clear_line(qw("worker", "--handlers", "no_such_module_xyz", "--dsn", dsn), 2,
                    "cannot import handler module 'no_such_module_xyz'")
    assert query(dsn, "SELECT count(*) FROM queueworker.tasks") == [(0,)]


@pytest.mark.integration
def test_enqueue_status_cancel_retry_roundtrip(dsn):
    result = qw("enqueue", "qw.sleep", "--payload", '{"seconds": 1}', "--queue", "mail", "--count", "3",
                "--dsn", dsn)
    assert result.returncode == 0 and "enqueued 3 tasks" in result.stdout
    task_id = query(dsn, "SELECT min(id) FROM queueworker.tasks")[0][0]

    assert qw("cancel", str(task_id), "--dsn", dsn).returncode == 0
    _one_clear_line(qw("cancel", str(task_id), "--dsn", dsn), 2, "is cancelled")
    _one_clear_line(qw("retry", "999999", "--dsn", dsn), 2, "no task with id 999999")
    retried = qw("retry", str(task_id), "--dsn", dsn)
    assert retried.returncode == 0 and "pending again" in retried.stdout

    report = json.loads(qw("status", "--json", "--dsn", dsn).stdout)
    assert report["queues"]["mail"]["pending"] == 3
    text = qw("status", "--dsn", dsn, "--queue", "mail").stdout
    assert "mail" in text and "(no live workers)" in text


@pytest.mark.integration
def test_migrate_is_idempotent(dsn):
    result = qw("migrate", "--dsn", dsn)
    assert result.returncode == 0 and "nothing to apply" in result.stdout


@pytest.mark.integration
def test_worker_refuses_an_unmigrated_database_until_told_to_migrate(blank_dsn):
    proc = subprocess.Popen([sys.executable, "-m", "queueworker.cli", "worker", "--dsn", blank_dsn,
                             "--log-format", "text"], stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        while "cannot start" not in line:
            line = proc.stderr.readline()
        assert "run `queueworker migrate`" in line
    finally:
        proc.terminate()
        assert proc.wait(20) == 0
    proc = subprocess.Popen([sys.executable, "-m", "queueworker.cli", "worker", "--dsn", blank_dsn, "--migrate"],
                            stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: query(blank_dsn, "SELECT to_regclass('queueworker.workers') IS NOT NULL")[0][0]
                   and query(blank_dsn, "SELECT count(*) FROM queueworker.workers")[0][0] == 1,
                   message="worker migrated and registered")
    finally:
        proc.terminate()
        assert proc.wait(20) == 0
