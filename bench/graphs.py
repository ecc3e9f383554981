"""What dependency graphs cost (queueworker only): a wide fan-in, a wide fan-out and a long chain,
each on a fresh database.

- Fan-in: one dependent of `prerequisites` tasks, enqueued in one transaction: the wall time of
  the enqueue and its commit (the commit settles the new dependent's edges). Then the
  prerequisites are claimed and completed in batches of 100 by the worker's statements: the
  slowest completion, and the total.
- Fan-out: `dependents` tasks that each depend on one prerequisite, enqueued in one transaction
  (wall time with the commit); then the prerequisite's completion (`COMPLETE_SUCCEEDED`, the
  statement that releases them all): its wall time, checked by counting the dependents pending.
- Chain: `enqueue_chain` of `chain` stages, run to the end one stage at a time by the worker's
  statements (`CLAIM`, then `COMPLETE_SUCCEEDED`, which releases the next stage): the wall time,
  and per stage, beside as many plain tasks (at most BASELINE) claimed and completed the same
  way: the difference is what the graph costs a stage. What a worker process adds per stage
  (hearing of the release, claiming, flushing) is the latency scenario's, not the graph's.
"""

from __future__ import annotations

import time
import uuid

import psycopg

from queueworker.client.producer import enqueue, enqueue_chain, enqueue_many
from queueworker.db import lease, statements

NOOP = {"task": "qw.noop"}
BATCH = 100
# Plain tasks claimed and completed one at a time beside the chain: what a stage costs without a graph.
BASELINE = 1_000


def _timed_commit(dsn: str, enqueue_graph) -> tuple[object, float]:
    with psycopg.connect(dsn) as conn:
        started = time.perf_counter()
        made = enqueue_graph(conn)
        conn.commit()
        return made, time.perf_counter() - started


def _claim(conn: psycopg.Connection, queue: str, limit: int) -> list[lease.ClaimedRow]:
    return statements.fetch(conn, lease.CLAIM, lease.ClaimParams(
        queue=queue, worker=uuid.uuid4(), lease_seconds=300, timeout_seconds=600, limit=limit))


def _complete(conn: psycopg.Connection, claimed: list[lease.ClaimedRow]) -> float:
    started = time.perf_counter()
    statements.fetch(conn, lease.COMPLETE_SUCCEEDED, lease.CompleteSucceededParams(
        ids=[row.id for row in claimed], tokens=[row.lease_token for row in claimed], results=[None] * len(claimed)))
    return time.perf_counter() - started


def _states(conn: psycopg.Connection, ids: list[int]) -> dict[str, int]:
    return dict(conn.execute("SELECT state::text, count(*) FROM queueworker.tasks WHERE id = ANY(%s) GROUP BY 1",
                             (ids,)).fetchall())


def fan_in(dsn: str, prerequisites: int) -> dict:
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = enqueue_many(conn, [{**NOOP, "queue": "fan_in"}] * prerequisites)
    dependent, commit_seconds = _timed_commit(dsn, lambda conn: enqueue(conn, "qw.noop", queue="fan_in_done",
                                                                        depends_on=ids))
    slowest = total = 0.0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while claimed := _claim(conn, "fan_in", BATCH):
            seconds = _complete(conn, claimed)
            slowest, total = max(slowest, seconds), total + seconds
        if _states(conn, [dependent]) != {"pending": 1}:
            raise RuntimeError("the fan-in's dependent was not released")
    return {"prerequisites": prerequisites, "enqueue_commit_s": commit_seconds,
            "slowest_completion_s": slowest, "completions_s": total}


def fan_out(dsn: str, dependents: int) -> dict:
    with psycopg.connect(dsn, autocommit=True) as conn:
        prerequisite = enqueue(conn, "qw.noop", queue="fan_out")
    ids, commit_seconds = _timed_commit(dsn, lambda conn: enqueue_many(
        conn, [{**NOOP, "queue": "fan_out_done", "depends_on": [prerequisite]}] * dependents))
    with psycopg.connect(dsn, autocommit=True) as conn:
        release_seconds = _complete(conn, _claim(conn, "fan_out", 1))
        if _states(conn, ids) != {"pending": dependents}:
            raise RuntimeError("the fan-out's dependents were not all released")
    return {"dependents": dependents, "enqueue_commit_s": commit_seconds, "release_s": release_seconds}


def _one_at_a_time(conn: psycopg.Connection, queue: str) -> int:
    completed = 0
    while claimed := _claim(conn, queue, 1):
        _complete(conn, claimed)
        completed += 1
    return completed


def chain(dsn: str, stages: int) -> dict:
    with psycopg.connect(dsn) as conn:
        ids = enqueue_chain(conn, [{**NOOP, "queue": "chain"}] * stages)
        enqueue_many(conn, [{**NOOP, "queue": "plain"}] * min(stages, BASELINE))
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        plain = _one_at_a_time(conn, "plain")
        baseline = time.perf_counter() - started
        started = time.perf_counter()
        completed = _one_at_a_time(conn, "chain")
        wall = time.perf_counter() - started
        if completed != stages or _states(conn, ids) != {"succeeded": stages}:
            raise RuntimeError("the chain ended without every stage succeeding")
    return {"stages": stages, "wall_s": wall, "per_stage_ms": wall * 1000 / stages,
            "plain_per_task_ms": baseline * 1000 / plain}
