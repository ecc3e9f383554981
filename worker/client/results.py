"""Reading tasks back for applications: `get_task`, a task as stored now, its JSON decoded, and
`wait_for`, which waits until it has finished."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from .. import jsonvalue
from ..db import statements
from ..db.inspect import TaskRow
from ..db.notify import FINISHED_CHANNEL, LISTEN_FINISHED, UNLISTEN_FINISHED
from ..db.statements import NO_PARAMS
from .inspect import task as task_row


@dataclass(frozen=True)
class TaskInfo:
    """A task as stored now. `payload`, `result`, `error`, `progress` and `checkpoint` are decoded
    JSON (None where there is none); `get_task` raises jsonvalue.Undecodable, saying which field,
    for JSON Python cannot read."""

    id: int
    queue: str
    task: str
    state: str
    attempts: int
    max_attempts: int
    priority: int
    payload: Any
    result: Any
    error: Any
    progress: Any
    checkpoint: Any
    dedupe_key: str | None
    key: str | None  # TaskSpec.key
    run_id: int | None
    run_partition: int | None
    continued_from: int | None
    created_at: datetime
    run_after: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        return self.state in ("succeeded", "failed", "cancelled")


def get_task(conn: psycopg.Connection, task_id: int) -> TaskInfo | None:
    """The task with this id, or None (never enqueued, or deleted after the retention period)."""
    row = task_row(conn, task_id)
    return None if row is None else task_info(row)


def task_info(row: TaskRow) -> TaskInfo:
    decoded = {}
    for field in ("payload", "result", "error", "progress", "checkpoint"):
        text = getattr(row, f"{field}_json")
        try:
            decoded[field] = None if text is None else jsonvalue.decode(text)
        except jsonvalue.Undecodable as exc:
            raise jsonvalue.Undecodable(f"task {row.id}'s {field} cannot be decoded: {exc}") from None
    return TaskInfo(row.id, row.queue, row.task, row.state, row.attempts, row.max_attempts, row.priority,
                    created_at=row.created_at, run_after=row.run_after, started_at=row.started_at,
                    finished_at=row.finished_at, dedupe_key=row.dedupe_key, key=row.key, run_id=row.run_id,
                    run_partition=row.run_partition, continued_from=row.continued_from, **decoded)


# How often wait_for looks at the task when no notification comes (a task enqueued without
# notify_on_finish, a connection inside a transaction, listen=False, a notification lost).
WAIT_POLL_SECONDS = 1.0


def wait_for(conn: psycopg.Connection, task_id: int, timeout: float, listen: bool = True) -> TaskInfo:
    """Blocks until the task has finished (succeeded, failed or cancelled) and returns it; raises
    TimeoutError after `timeout` seconds, LookupError for a task that does not exist. A task
    enqueued with `notify_on_finish=True` is noticed the moment it finishes when `conn` is in
    autocommit mode (it LISTENs); otherwise the task is looked at every second. Through a
    PgBouncer in transaction pooling mode pass `listen=False`: a LISTEN would stay behind on a
    server connection other clients share, and hear nothing."""
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
    deadline = time.monotonic() + timeout
    listening = listen and conn.autocommit
    if listening:
        statements.execute(conn, LISTEN_FINISHED, NO_PARAMS)
    try:
        believe = True  # whether a notice may cut the next wait short
        while True:
            info = get_task(conn, task_id)
            if info is None:
                raise LookupError(f"no task with id {task_id}")
            if info.finished:
                return info
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"task {task_id} is still {info.state} after {timeout:g} s")
            wait = min(left, WAIT_POLL_SECONDS)
            if listening:
                # A notice that lied (the task was looked up, unfinished) has the next wait run its
                # full length: a flood of forged notices costs at most two looks per wait.
                believe = not _finish_noticed(conn, task_id, wait, believe)
            else:
                time.sleep(wait)
    finally:
        if listening:
            statements.execute(conn, UNLISTEN_FINISHED, NO_PARAMS)


def _finish_noticed(conn: psycopg.Connection, task_id: int, wait: float, believe: bool) -> bool:
    """Waits `wait` seconds, or, when `believe`, until a notice says the task finished (then True).
    A notice is only a hint (any login may LISTEN and NOTIFY on queueworker_finished): the caller
    looks the task up before it believes it. Notices not believed are read all the same, so none
    is left to cut a later wait short."""
    payload = str(task_id)
    for notice in conn.notifies(timeout=wait):
        if believe and notice.channel == FINISHED_CHANNEL and notice.payload == payload:
            return True
    return False
