"""What a partitioned run's fan-in costs, and what flow control costs a queue (queueworker only): a run of N no-op partitions with a no-op
consolidation, against N plain no-op tasks, on fresh databases, alternating.

Timings come from the database's clock: the drain from the first partition's start to the last
one's end, and the fan-in lag from the last partition's end to the consolidation's start (the
statement that counts the last success enqueues the consolidation; a worker then has to hear of
it and claim it). The enqueue is timed too: start_run against enqueue_many of the same tasks.
"""

from __future__ import annotations

import time

import psycopg

from bench.scenarios import Workers
from bench.systems import System
from queueworker.client.producer import enqueue_many, start_run

NOOP = {"task": "qw.noop"}
# The run's tasks (partitions and consolidation) or, without a run, every task.
SUMMARY = """
SELECT extract(epoch FROM max(finished_at) FILTER (WHERE run_partition IS NOT NULL OR run_id IS NULL)
                          - min(started_at))::float8 AS drain,
       extract(epoch FROM max(started_at) FILTER (WHERE run_id IS NOT NULL AND run_partition IS NULL)
                          - max(finished_at) FILTER (WHERE run_partition IS NOT NULL))::float8 AS lag,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded
FROM queueworker.tasks
"""


def fan_in(system: System, dsn: str, partitions: int, processes: int, concurrency: int, with_run: bool,
           timeout: float = 600) -> dict:
    with psycopg.connect(dsn) as conn:
        started = time.perf_counter()
        if with_run:
            run_id = start_run(conn, "bench", [NOOP] * partitions, on_success=NOOP)
        else:
            enqueue_many(conn, [NOOP] * partitions)
        conn.commit()
        enqueue_seconds = time.perf_counter() - started
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE queueworker.tasks")
        conn.execute("CHECKPOINT")
    workers = Workers.start(system, dsn, processes, concurrency)
    started = time.monotonic()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            finished = ("SELECT state = 'succeeded' FROM queueworker.runs WHERE id = %s", (run_id,)) if with_run \
                else ("SELECT NOT EXISTS (SELECT 1 FROM queueworker.tasks_active)", ())
            while not conn.execute(*finished).fetchone()[0]:
                if time.monotonic() - started > timeout:
                    raise RuntimeError(f"not finished within {timeout:g} s")
                workers.check_alive()
                time.sleep(0.05)
            wall = time.monotonic() - started
            drain, lag, succeeded = conn.execute(SUMMARY).fetchone()
    finally:
        workers.stop()
    expected = partitions + (1 if with_run else 0)
    if succeeded != expected:
        raise RuntimeError(f"{succeeded} of {expected} tasks succeeded")
    return {"kind": "run" if with_run else "plain", "enqueue_per_s": partitions / enqueue_seconds,
            "tasks_per_s": partitions / drain, "fan_in_lag_ms": None if lag is None else lag * 1000,
            "wall_seconds": wall}


def loose_limit(dsn: str, queue: str = "default") -> None:
    """Flow control on `queue` that never binds: every claim takes the limited path, none waits."""
    from queueworker.client.operations import set_limits

    with psycopg.connect(dsn, autocommit=True) as conn:
        set_limits(conn, queue, rate_per_second=1_000_000, burst=1_000_000)
