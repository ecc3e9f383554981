"""Helpers of the scripts that measure queueworker alone (bench/fair_share.py, bench/admission.py,
bench/ceiling_parts.py): a fresh migrated database per measure, worker processes, waiting for a
drain, percentiles. The comparisons with the peers are bench/runner.py's.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import psycopg

from queueworker.db.migrate import migrate

UNFINISHED = "SELECT EXISTS (SELECT 1 FROM queueworker.tasks WHERE state IN ('pending', 'running', 'retrying'))"


def fresh_database(admin: str, name: str) -> str:
    """A new migrated database for one measure, replacing any of that name (history is
    append-only: nothing is truncated)."""
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = psycopg.conninfo.make_conninfo(admin, dbname=name)
    migrate(dsn)
    return dsn


@dataclass
class Workers:
    procs: list[subprocess.Popen]
    log: str  # every worker's log lines (warnings and worse)

    @classmethod
    def start(cls, dsn: str, count: int, concurrency: int, *extra: str) -> Workers:
        log = tempfile.NamedTemporaryFile(prefix="qw-bench-", suffix=".log", delete=False)
        procs = [subprocess.Popen([sys.executable, "-m", "queueworker.cli", "worker", "--builtin-tasks", "--dsn", dsn,
                                   "--concurrency", str(concurrency), "--log-level", "WARNING", *extra],
                                  stdout=log, stderr=log) for _ in range(count)]
        return cls(procs, log.name)

    def wait_registered(self, dsn: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        with psycopg.connect(dsn, autocommit=True) as conn:
            while conn.execute("SELECT count(*) FROM queueworker.workers").fetchone()[0] < len(self.procs):
                if time.monotonic() > deadline:
                    raise RuntimeError("workers did not register")
                time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        killed = 0
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                killed += 1
        if killed:  # a worker that does not stop is a bug the measure must not hide
            print(f"warning: {killed} of {len(self.procs)} worker processes did not stop within 30 s of SIGTERM "
                  f"and were killed; their log: {self.log}", file=sys.stderr)


def wait_drained(conn: psycopg.Connection, interval: float = 0.25) -> None:
    """Returns once no task is waiting, running or retrying (`conn` in autocommit), looking every `interval` s."""
    while conn.execute(UNFINISHED).fetchone()[0]:
        time.sleep(interval)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]

