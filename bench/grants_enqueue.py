"""Bulk enqueue as a least-privileged producer, with and without queue grants (queueworker only).

`enqueue_many` of `tasks` no-op tasks in calls of 10,000, each committed, as in the enqueue
scenario (bench/enqueue.py), by three callers, alternating, on one database set up by
docs/database-roles.sql:

- `owner`: the superuser (not bound by grants; the hash set by the statement);
- `producer, no grants`: a producer login, no queue grant at all (every queue allowed: the insert
  trigger's check is one look at `queueworker.queue_grants`);
- `producer, granted`: 20 grants of other roles and the producer's own pattern, which its queue
  matches (the trigger matches every inserted row's queue).

    python -m bench.grants_enqueue [--tasks 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from queueworker.client.producer import enqueue_many
from queueworker.dev.localpg import LocalPostgres

ROLES_SCRIPT = Path(__file__).resolve().parent.parent / "docs" / "database-roles.sql"
BATCH = 10_000
CALLERS = ("owner", "producer, no grants", "producer, granted")


def _prepare(admin: str, caller: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("DELETE FROM queueworker.queue_grants")
        if caller == "producer, granted":
            conn.execute("INSERT INTO queueworker.queue_grants (grantee, pattern) "
                         "SELECT 'bench_other_' || i, 'other' || i || '.*' FROM generate_series(1, 20) i "
                         "UNION ALL SELECT 'bench_producer', 'bench.*'")


def _enqueue_rate(dsn: str, tasks: int) -> float:
    specs = [{"task": "qw.noop", "queue": "bench.enqueue", "payload": {"n": n}} for n in range(tasks)]
    with psycopg.connect(dsn) as conn:
        started = time.perf_counter()
        for first in range(0, tasks, BATCH):
            enqueue_many(conn, specs[first:first + BATCH])
            conn.commit()
        return tasks / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    server = LocalPostgres(durable=True)
    admin = server.start()
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(ROLES_SCRIPT.read_text())
            conn.execute("CREATE ROLE bench_producer LOGIN PASSWORD 'bench' IN ROLE queueworker_producer")
        subprocess.run([sys.executable, "-m", "queueworker.cli", "migrate", "--dsn", admin], check=True,
                       capture_output=True)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(ROLES_SCRIPT.read_text())
        producer = psycopg.conninfo.make_conninfo(admin, user="bench_producer", password="bench")
        rates: dict[str, list[float]] = {caller: [] for caller in CALLERS}
        print(f"load before: {os.getloadavg()[0]:.2f}")
        for _ in range(args.rounds):
            for caller in CALLERS:
                _prepare(admin, caller)
                rates[caller].append(_enqueue_rate(admin if caller == "owner" else producer, args.tasks))
                with psycopg.connect(admin, autocommit=True) as conn:
                    conn.execute("TRUNCATE queueworker.tasks_active")  # each round starts from an empty queue
        print(f"load after: {os.getloadavg()[0]:.2f}")
        for caller, values in rates.items():
            print(f"{caller:<20} median {statistics.median(values):>9,.0f} tasks/s  "
                  f"({', '.join(f'{v:,.0f}' for v in values)})")
    finally:
        server.destroy()


if __name__ == "__main__":
    main()
