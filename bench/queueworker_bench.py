"""queueworker's own benchmark scenarios: burn-down throughput and enqueue-to-start latency.

Timings come from the database's own clock (created_at, started_at, finished_at), so polling
for completion does not distort them.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import psycopg

from queueworker.db.migrate import migrate
from queueworker.client.producer import enqueue, enqueue_many

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

    @classmethod
    def start(cls, dsn: str, count: int, concurrency: int, *extra: str) -> Workers:
        log = tempfile.NamedTemporaryFile(prefix="qw-bench-", suffix=".log", delete=False)
        procs = [subprocess.Popen([sys.executable, "-m", "queueworker.cli", "worker", "--builtin-tasks", "--dsn", dsn,
                                   "--concurrency", str(concurrency), "--log-level", "WARNING", *extra],
                                  stdout=log, stderr=log) for _ in range(count)]
        return cls(procs)

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
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_drained(conn: psycopg.Connection, interval: float = 0.25) -> None:
    """Returns once no task is waiting, running or retrying (`conn` in autocommit), looking every `interval` s."""
    while conn.execute(UNFINISHED).fetchone()[0]:
        time.sleep(interval)


def reset(dsn: str) -> None:
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE queueworker.tasks, queueworker.task_events, queueworker.workers")
        conn.execute("VACUUM ANALYZE queueworker.tasks")


def burn_down(dsn: str, tasks: int, processes: int = 2, concurrency: int = 100) -> float:
    """Tasks/s draining `tasks` pre-enqueued no-op tasks with `processes` workers."""
    reset(dsn)
    with psycopg.connect(dsn) as conn:
        enqueue_many(conn, ({"task": "qw.noop"} for _ in range(tasks)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE queueworker.tasks")
    workers = Workers.start(dsn, processes, concurrency)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_drained(conn)
            first, last, done = conn.execute("""
                SELECT min(started_at), max(finished_at), count(*) FILTER (WHERE state = 'succeeded')
                FROM queueworker.tasks""").fetchone()
    finally:
        workers.stop()
    if done != tasks:
        raise RuntimeError(f"only {done} of {tasks} succeeded")
    return tasks / (last - first).total_seconds()


def idle_latency(dsn: str, samples: int, processes: int = 2, gap: float = 0.05) -> list[float]:
    """Enqueue-to-start latencies (ms) of single tasks sent to idle workers (the NOTIFY path)."""
    reset(dsn)
    workers = Workers.start(dsn, processes, 10)
    try:
        workers.wait_registered(dsn)
        time.sleep(1.0)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(samples):
                enqueue(conn, "qw.noop")
                time.sleep(gap)
            wait_drained(conn, 0.1)
            rows = conn.execute("""SELECT extract(epoch FROM started_at - created_at) * 1000
                                   FROM queueworker.tasks ORDER BY id""").fetchall()
    finally:
        workers.stop()
    return [float(r[0]) for r in rows]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


if __name__ == "__main__":
    from queueworker.dev.localpg import LocalPostgres

    server = LocalPostgres(durable=True)
    dsn = server.start()
    try:
        n = int(os.environ.get("TASKS", "20000"))
        print("burn-down tasks/s:", [round(burn_down(dsn, n)) for _ in range(int(os.environ.get("RUNS", "1")))])
        lat = idle_latency(dsn, int(os.environ.get("SAMPLES", "200")))
        print(f"idle latency ms: p50={statistics.median(lat):.2f} p99={percentile(lat, 99):.2f}")
    finally:
        server.destroy()
