"""A partitioned export with fan-in and a watermark (the project's seed 003): a run fans out one
task per partition of a source table; each partition stages the rows changed since the last
successful export; when every partition has succeeded, one consolidation task moves the staged
rows into the canonical table, and only then does the watermark advance. One partition fails on
its first attempt (a source timeout) and succeeds when the worker retries it.

    python -m examples.partitioned_export --dsn postgresql://...   # or $DATABASE_URL
    python -m examples.partitioned_export --partitions 50 --flaky 17

It migrates the database, creates its own schema `export_demo` (a source table of items, a staging
table and a canonical table), then runs two exports with two `queueworker worker` processes and
this module's handlers: the first exports every item; between the two, some items change; the
second exports only those, because its consolidation reads the watermark the first one left.
Workers never count partitions or decide to consolidate: the database does, in the statement that
records each partition's outcome.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import psycopg

from queueworker import TaskContext, start_run, task
from queueworker.migrate import migrate

QUEUE = "export"
HANDLERS = "examples.partitioned_export"  # this module, by the name a worker imports it with
WATERMARK = "export_demo.items"

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS export_demo;
CREATE TABLE IF NOT EXISTS export_demo.items (
    id integer PRIMARY KEY, price integer NOT NULL, updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS export_demo.staged (
    run_id bigint, item_id integer, price integer NOT NULL, PRIMARY KEY (run_id, item_id));
CREATE TABLE IF NOT EXISTS export_demo.canonical (
    item_id integer PRIMARY KEY, price integer NOT NULL, run_id bigint NOT NULL);
"""


def _connect() -> psycopg.Connection:
    """Handlers run in worker processes, which get the database's URL the way a pod does."""
    return psycopg.connect(os.environ["DATABASE_URL"])


@task(name="export.partition")
def export_partition(payload, ctx: TaskContext):
    """Stages this partition's items changed since the watermark. Idempotent per (run, item), so
    an attempt that is retried, rescued or drained can simply run again."""
    if payload["partition"] == payload["flaky"] and ctx.attempt == 1:
        raise TimeoutError(f"source timed out reading partition {payload['partition']}")
    with _connect() as conn:
        staged = conn.execute(
            "INSERT INTO export_demo.staged (run_id, item_id, price) "
            "SELECT %(run)s, id, price FROM export_demo.items "
            "WHERE id %% %(partitions)s = %(partition)s "
            "  AND (%(since)s::timestamptz IS NULL OR updated_at > %(since)s::timestamptz) "
            "ON CONFLICT (run_id, item_id) DO UPDATE SET price = EXCLUDED.price",
            {"run": ctx.run.id, "partitions": payload["partitions"], "partition": ctx.run.partition,
             "since": ctx.run.watermark_before}).rowcount
    return {"staged": staged}


@task(name="export.consolidate")
def consolidate(payload, ctx: TaskContext):
    """Runs once, only after every partition succeeded: moves the run's staged rows into the
    canonical table. The watermark advances when this returns, never before."""
    with _connect() as conn:
        moved = conn.execute(
            "WITH staged AS (DELETE FROM export_demo.staged WHERE run_id = %(run)s RETURNING item_id, price) "
            "INSERT INTO export_demo.canonical (item_id, price, run_id) SELECT item_id, price, %(run)s FROM staged "
            "ON CONFLICT (item_id) DO UPDATE SET price = EXCLUDED.price, run_id = EXCLUDED.run_id",
            {"run": ctx.run.id}).rowcount
    return {"consolidated": moved, "since": ctx.run.watermark_before}


@dataclass
class ExportReport:
    run_id: int
    state: str
    watermark_before: str | None
    watermark_after: str | None
    consolidated: int | None
    flaky_attempts: int


def start_export(conn: psycopg.Connection, partitions: int, flaky: int) -> int:
    return start_run(conn, "export", [{"task": "export.partition", "queue": QUEUE,
                                       "payload": {"partition": i, "partitions": partitions, "flaky": flaky}}
                                      for i in range(partitions)],
                     on_success={"task": "export.consolidate", "queue": QUEUE}, watermark=WATERMARK)


def wait_for_run(conn: psycopg.Connection, run_id: int, timeout: float) -> ExportReport:
    deadline = time.monotonic() + timeout
    while True:
        state, before, after, consolidated = conn.execute(
            "SELECT r.state::text, r.watermark_before #>> '{}', r.watermark_after #>> '{}', "
            "       (t.result ->> 'consolidated')::integer "
            "FROM queueworker.runs r LEFT JOIN queueworker.tasks t ON t.id = r.success_task_id "
            "WHERE r.id = %s", (run_id,)).fetchone()
        if state != "running":
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"run {run_id} did not finish within {timeout:g} s")
        time.sleep(0.2)
    flaky_attempts = conn.execute(
        "SELECT max(attempts) FROM queueworker.tasks WHERE run_id = %s AND run_partition IS NOT NULL",
        (run_id,)).fetchone()[0]
    return ExportReport(run_id, state, before, after, consolidated, flaky_attempts)


def run(dsn: str, items: int, partitions: int, flaky: int, changed: int,
        timeout: float = 120) -> list[ExportReport]:
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("TRUNCATE export_demo.items, export_demo.staged, export_demo.canonical")
        conn.execute("DELETE FROM queueworker.watermarks WHERE name = %s", (WATERMARK,))
        conn.execute("INSERT INTO export_demo.items (id, price) SELECT i, 100 FROM generate_series(1, %s) i",
                     (items,))
    env = {**os.environ, "DATABASE_URL": dsn}
    workers = [subprocess.Popen([sys.executable, "-m", "queueworker.cli", "worker", "--handlers", HANDLERS,
                                 "--queue", QUEUE, "--concurrency", "8", "--log-level", "error"], env=env)
               for _ in range(2)]
    reports = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            reports.append(wait_for_run(conn, start_export(conn, partitions, flaky), timeout))
            conn.execute("UPDATE export_demo.items SET price = price + 1, updated_at = now() WHERE id <= %s",
                         (changed,))
            reports.append(wait_for_run(conn, start_export(conn, partitions, -1), timeout))
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(30)
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.partitioned_export",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("DATABASE_URL"), help="default: $DATABASE_URL")
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=50)
    parser.add_argument("--flaky", type=int, default=17, help="the partition whose first attempt fails")
    parser.add_argument("--changed", type=int, default=25, help="items changed between the two exports")
    args = parser.parse_args(argv)
    if not args.dsn:
        parser.error("give --dsn or set DATABASE_URL")
    for report in run(args.dsn, args.items, args.partitions, args.flaky, args.changed):
        print(f"run {report.run_id}: {report.state}, consolidated {report.consolidated} rows, "
              f"most attempts of a partition {report.flaky_attempts}, "
              f"watermark {report.watermark_before or 'none'} -> {report.watermark_after or 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
