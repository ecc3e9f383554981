"""Bulk enqueue: how fast each system's own bulk API takes a big batch of no-op tasks.

Each system enqueues `tasks` no-op tasks in calls of BATCH tasks (queueworker `enqueue_many`,
PGQueuer `Queries.enqueue` with lists, Procrastinate `batch_defer_async`), every call committed on
its own, into a fresh database with no worker running. Wall time of the calls only (connecting
and the schema excluded); the rows are counted afterwards, so a system that dropped some fails.
"""

from __future__ import annotations

import psycopg

from bench.systems import System

BATCH = 10_000


def enqueue_rate(system: System, dsn: str, tasks: int) -> dict:
    seconds = system.bulk_enqueue(dsn, tasks, min(BATCH, tasks))
    with psycopg.connect(dsn, autocommit=True) as conn:
        stored = conn.execute(system.remaining_sql).fetchone()[0]
    if stored != tasks:
        raise RuntimeError(f"{stored} of {tasks} tasks stored")
    return {"tasks": tasks, "batch": min(BATCH, tasks), "seconds": seconds, "tasks_per_s": tasks / seconds}
