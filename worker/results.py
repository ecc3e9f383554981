"""Reading tasks back: `get_task` for applications, and what `queueworker show` prints."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from . import jsonvalue, sql
from .db import typed_rows


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
    with conn.cursor(row_factory=typed_rows(sql.TaskRow)) as cursor:
        row = cursor.execute(sql.TASK, {"id": task_id}).fetchone()
    return None if row is None else task_info(row)


def task_info(row: sql.TaskRow) -> TaskInfo:
    decoded = {}
    for field in ("payload", "result", "error", "progress", "checkpoint"):
        text = getattr(row, f"{field}_json")
        try:
            decoded[field] = None if text is None else jsonvalue.decode(text)
        except jsonvalue.Undecodable as exc:
            raise jsonvalue.Undecodable(f"task {row.id}'s {field} cannot be decoded: {exc}") from None
    return TaskInfo(row.id, row.queue, row.task, row.state, row.attempts, row.max_attempts, row.priority,
                    created_at=row.created_at, run_after=row.run_after, started_at=row.started_at,
                    finished_at=row.finished_at, dedupe_key=row.dedupe_key, run_id=row.run_id,
                    run_partition=row.run_partition, continued_from=row.continued_from, **decoded)
