"""Helpers for tests that run real worker processes against a real Postgres."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

FAST_LEASES = ["--lease-seconds", "3", "--heartbeat-seconds", "1"]


class WorkerProcess:
    """A `queueworker worker` child process with its log in a temp file."""

    def __init__(self, dsn: str, *args: str, env: dict[str, str] | None = None):
        self.log_path = Path(tempfile.mkstemp(prefix="qw-worker-", suffix=".log")[1])
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "queueworker.cli", "worker", "--dsn", dsn, "--log-format", "text", *args],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.flush()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1,
               message: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message} (last value {value!r})")
        time.sleep(interval)


def query(dsn: str, statement: str, params: Any = None) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement, params).fetchall()


def scalar(dsn: str, statement: str, params: Any = None) -> Any:
    return query(dsn, statement, params)[0][0]


def state_counts(dsn: str) -> dict[str, int]:
    return dict(query(dsn, "SELECT state::text, count(*) FROM queueworker.tasks GROUP BY state"))


def worker_id_of(dsn: str, pid: int) -> str | None:
    rows = query(dsn, "SELECT id::text FROM queueworker.workers WHERE pid = %s", (pid,))
    return rows[0][0] if rows else None
