"""Idle enqueue-to-start latency of one worker: connected directly (LISTEN) and through a PgBouncer
in transaction pooling mode (polling every --poll-interval-seconds).

    .venv/bin/python -m bench.pgbouncer_latency [--samples 40] [--poll-interval 1.0]

One task at a time is enqueued into an idle queue, at a random moment (so polls are met at any
phase), and its latency is `started_at - created_at`, both stamped by the database's clock.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import psycopg

from queueworker.dev.localpg import LocalPostgres
from queueworker.db.migrate import migrate
from queueworker.client.producer import enqueue
from tests.pgbouncer import PgBouncer, find_pgbouncer
from tests.support import WorkerProcess, scalar, wait_until

LATENCY = """SELECT max(extract(epoch FROM started_at - created_at) * 1000) FROM queueworker.tasks
             WHERE id = %s AND state = 'succeeded'"""


def measure(worker_dsn: str, direct_dsn: str, samples: int, *worker_args: str) -> list[float]:
    """Milliseconds from enqueue to start, one idle task at a time, on a worker using `worker_dsn`."""
    worker = WorkerProcess(worker_dsn, "--concurrency", "1", *worker_args)
    try:
        wait_until(lambda: scalar(direct_dsn, "SELECT count(*) FROM queueworker.workers"), timeout=60,
                   message="the worker to register")
        time.sleep(6)  # past its start-up (the listen check takes up to 5 s through PgBouncer)
        latencies = []
        with psycopg.connect(worker_dsn, autocommit=True) as conn:
            for _ in range(samples):
                time.sleep(random.uniform(0.3, 1.7))
                task_id = enqueue(conn, "qw.noop")
                latencies.append(float(wait_until(lambda: scalar(direct_dsn, LATENCY, (task_id,)), timeout=60,
                                                  interval=0.05, message="the task to finish")))
        return latencies
    finally:
        worker.stop()


def summary(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"n={len(ordered)} p50 {statistics.median(ordered):.1f} ms, p99 {p99:.1f} ms, max {ordered[-1]:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    args = parser.parse_args()
    binary = find_pgbouncer()
    if binary is None:
        raise SystemExit("pgbouncer is not installed (apt-get install pgbouncer)")
    server = LocalPostgres()
    direct = server.start()
    bouncer = PgBouncer(binary, direct)
    try:
        migrate(direct)
        print("direct, LISTEN:", summary(measure(direct, direct, args.samples)))
        print(f"PgBouncer (transaction pooling), polling every {args.poll_interval:g} s:",
              summary(measure(bouncer.dsn_for(direct), direct, args.samples,
                              "--poll-interval-seconds", str(args.poll_interval))))
    finally:
        bouncer.stop()
        server.destroy()


if __name__ == "__main__":
    main()
