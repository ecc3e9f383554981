"""Tasks as stored, read back: one task and its audit trail, the newest tasks, the states of some.

What `queueworker show` and `queueworker list` print and the console shows comes from here, so both
read the same rows; `get_task` (queueworker.client.results) builds its TaskInfo on `task`. The JSON
columns stay text: Python may not read what another language stored, and each caller decides how to
show it.
"""

from __future__ import annotations

from collections.abc import Iterable

import psycopg

from ..db import statements
from ..db.inspect import (
    LIST_TASKS, TASK, TASK_EVENTS, ListedTaskRow, ListTasksParams, TaskEventRow, TaskEventsParams, TaskIdsParams,
    TaskParams, TaskRow)
from ..db.tasks import TASK_STATES


def task(conn: psycopg.Connection, task_id: int) -> TaskRow | None:
    """The task as stored, None when there is none with that id (never enqueued, or deleted after
    the retention period)."""
    return statements.fetch_one(conn, TASK, TaskParams(id=task_id))


def task_events(conn: psycopg.Connection, task_id: int, limit: int | None = None) -> list[TaskEventRow]:
    """The task's audit trail, oldest first: all of it, or its first `limit` events."""
    return statements.fetch(conn, TASK_EVENTS, TaskEventsParams(id=task_id, limit=limit))


def list_tasks(conn: psycopg.Connection, *, queue: str | None = None, state: str | None = None,
               limit: int) -> list[ListedTaskRow]:
    """The newest `limit` tasks, of one queue and one state or of all."""
    return statements.fetch(conn, LIST_TASKS, ListTasksParams(queue=queue, state=state, limit=limit))


def task_states(conn: psycopg.Connection, ids: Iterable[int]) -> dict[int, str]:
    """The tasks' states now, by id; an id without a task is left out. Says why a retry or a cancel
    changed nothing."""
    return {row.id: row.state for row in statements.fetch(conn, TASK_STATES, TaskIdsParams(ids=list(ids)))}
