"""Partitioned runs that exist: read them, retry their failed partitions, finalize a failed one.

A run is started by `start_run` (queueworker.client.producer), with its partitions. What
`queueworker runs` and `queueworker run` print and the console shows comes from here. Each call runs
in the caller's transaction.
"""

from __future__ import annotations

import psycopg

from ..db import statements
from ..db.runs import (
    FINALIZE_RUN, RETRY_RUN, RUN, RUN_EVENTS, RUN_TASKS, RUNS, RunEventRow, RunEventsParams, RunParams, RunRow,
    RunsParams, RunTaskRow, RunTasksParams)


def runs(conn: psycopg.Connection, *, name: str | None = None, limit: int) -> list[RunRow]:
    """The newest `limit` runs, of one name or of all."""
    return statements.fetch(conn, RUNS, RunsParams(name=name, limit=limit))


def run(conn: psycopg.Connection, run_id: int) -> RunRow | None:
    """The run, None when there is none with that id."""
    return statements.fetch_one(conn, RUN, RunParams(id=run_id))


def run_tasks(conn: psycopg.Connection, run_id: int, limit: int | None = None) -> list[RunTaskRow]:
    """The run's tasks: its partitions in order, then its consolidation and alert; all of them, or
    the first `limit`."""
    return statements.fetch(conn, RUN_TASKS, RunTasksParams(id=run_id, limit=limit))


def run_events(conn: psycopg.Connection, run_id: int, limit: int | None = None) -> list[RunEventRow]:
    """The run's audit trail, oldest first: all of it, or its first `limit` events."""
    return statements.fetch(conn, RUN_EVENTS, RunEventsParams(id=run_id, limit=limit))


def retry_run(conn: psycopg.Connection, run_id: int) -> int:
    """Puts the run's failed and cancelled partitions back to pending, as `retry` does a task, and
    wakes their queues; how many."""
    return statements.fetch(conn, RETRY_RUN, RunParams(id=run_id))[0].retried  # an aggregate: one row


def finalize_run(conn: psycopg.Connection, run_id: int) -> bool:
    """Consolidates a failed run on purpose: its consolidation is enqueued once every partition has
    ended. False (and nothing changes) unless the run is failed and was not consolidated."""
    return statements.fetch(conn, FINALIZE_RUN, RunParams(id=run_id))[0].finalized
