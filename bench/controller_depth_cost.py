"""The controller's per-tick database cost with a deep queue: `QUEUE_DEPTH` (and `WORKER_LEASES`,
run once per scale-down) timed over the controller's own pooled connection, with 1M and 10M ready
tasks, 200 running and 1000 retrying.

    .venv/bin/python -m bench.controller_depth_cost [--sizes 1000000 10000000] [--repeat 200]

Rows are bulk-inserted with SQL (audit trigger off while loading; it is not on the read path), then
VACUUM ANALYZE, as autovacuum would do on a queue that deep.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import psycopg

from queueworker.db.depth import QUEUE_DEPTH, WORKER_LEASES, QueueDepthParams, WorkerLeasesParams
from queueworker.db.migrate import migrate
from queueworker.db.statements import Params, Statement
from queueworker.dev.localpg import LocalPostgres
from queueworker_controller.queuedb import Database

QUEUE = "bench"
MAX_REPLICAS, TASKS_PER_REPLICA = 100, 10
CAP = MAX_REPLICAS * TASKS_PER_REPLICA + 1  # what the controller asks for with these settings
CHUNK = 1_000_000


def load(conn: psycopg.Connection, ready_rows: int) -> None:
    conn.execute("ALTER TABLE queueworker.tasks DISABLE TRIGGER tasks_audit_insert")
    for start in range(0, ready_rows, CHUNK):
        conn.execute("INSERT INTO queueworker.tasks (queue, task, delayed, run_after) "
                     "SELECT %s, 'qw.noop', false, now() - interval '1 hour' FROM generate_series(1, %s)",
                     (QUEUE, min(CHUNK, ready_rows - start)))
        conn.commit()
    conn.execute("ALTER TABLE queueworker.tasks ENABLE TRIGGER tasks_audit_insert")
    conn.commit()


def add_running_and_retrying(conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO queueworker.workers (id, hostname, pod_name, pod_namespace, pid, queues, concurrency, "
                 "running, version) SELECT gen_random_uuid(), 'h', 'pod-' || i, 'ns', i, ARRAY[%s], 10, 10, 'bench' "
                 "FROM generate_series(1, 20) i", (QUEUE,))
    conn.execute("INSERT INTO queueworker.tasks (queue, task, state, delayed, attempts, lease_owner, leased_until, "
                 "deadline_at, started_at) SELECT %s, 'qw.noop', 'running', false, 1, w.id, now() + interval '1 min', "
                 "now() + interval '1 hour', now() FROM queueworker.workers w, generate_series(1, 10)", (QUEUE,))
    conn.execute("INSERT INTO queueworker.tasks (queue, task, state, delayed, attempts, run_after) "
                 "SELECT %s, 'qw.noop', 'retrying', false, 1, now() + interval '1 hour' FROM generate_series(1, 1000)",
                 (QUEUE,))
    conn.commit()


async def timed(database: Database, statement: Statement, params: Params, repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        await database.fetch(statement, params)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def measure(dsn: str, repeat: int) -> None:
    """Times the two statements over the controller's own pooled connections."""
    database = Database(dsn)
    try:
        depth_params = QueueDepthParams(throughput=False, cap=CAP, queues=[QUEUE], lookaheads=[None])
        await timed(database, QUEUE_DEPTH, depth_params, 5)  # warm up
        depth = await timed(database, QUEUE_DEPTH, depth_params, repeat)
        leases = await timed(database, WORKER_LEASES, WorkerLeasesParams(namespace="ns", queue=QUEUE), repeat)
        (row,) = await database.fetch(QUEUE_DEPTH, depth_params)
        print(f"  QUEUE_DEPTH (cap {CAP}) -> ready {row.ready}, running {row.running}, retrying {row.retrying}: "
              f"{summary(depth)}")
        print(f"  WORKER_LEASES (20 workers, 200 leases): {summary(leases)}")
    finally:
        database.close()


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[int(len(ordered) * 0.95) - 1]
    return f"p50 {statistics.median(ordered):.2f} ms, p95 {p95:.2f} ms, max {ordered[-1]:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    server = LocalPostgres()
    server.start()
    try:
        migrate(server.dsn)
        with psycopg.connect(server.dsn) as conn:
            add_running_and_retrying(conn)
            loaded = 0
            for size in sorted(args.sizes):
                started = time.monotonic()
                load(conn, size - loaded)
                loaded = size
                conn.autocommit = True
                conn.execute("VACUUM ANALYZE queueworker.tasks")
                conn.autocommit = False
                print(f"{size:>10,} ready tasks loaded in {time.monotonic() - started:.0f}s")
                asyncio.run(measure(server.dsn, args.repeat))
    finally:
        server.destroy()


if __name__ == "__main__":
    main()
