"""Enqueueing tasks, alone or in batches, inside the caller's own transaction.

Pass a psycopg connection: the insert joins whatever transaction is open on it, so a
task commits or rolls back together with the application's data. Workers are woken by
one NOTIFY per queue per call, delivered when that transaction commits.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from . import sql

QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
DEFAULT_MAX_ATTEMPTS = 10
BATCH_SIZE = 5000


class TaskSpec(BaseModel):
    """One task to enqueue. Validated here so bad input fails before it reaches the database."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str = Field(min_length=1, max_length=200)
    payload: Any = Field(default_factory=dict)
    queue: str = Field(default="default", pattern=QUEUE_PATTERN)
    priority: int = Field(default=0, ge=-(2**31), lt=2**31)
    run_after: datetime | None = None
    delay: float | None = Field(default=None, ge=0)
    max_attempts: int = Field(default=DEFAULT_MAX_ATTEMPTS, ge=1, le=1000)
    timeout_seconds: int | None = Field(default=None, gt=0)

    @field_validator("payload")
    @classmethod
    def _json_payload(cls, value: Any) -> Any:
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"payload is not JSON-serialisable: {exc}") from None
        return value

    @field_validator("run_after")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("run_after must be timezone-aware")
        return value

    @model_validator(mode="after")
    def _one_schedule(self) -> TaskSpec:
        if self.run_after is not None and self.delay is not None:
            raise ValueError("give run_after or delay, not both")
        return self

    def due_at(self, now: datetime) -> datetime | None:
        """The absolute run_after, or None for 'now' (decided by the database clock)."""
        if self.delay:
            return now + timedelta(seconds=self.delay)
        return self.run_after


def _params(specs: Sequence[TaskSpec]) -> dict[str, list]:
    now = datetime.now(timezone.utc)
    return {
        "queues": [s.queue for s in specs],
        "tasks": [s.task for s in specs],
        "payloads": [Jsonb(s.payload) for s in specs],
        "priorities": [s.priority for s in specs],
        "run_afters": [s.due_at(now) for s in specs],
        "max_attempts": [s.max_attempts for s in specs],
        "timeouts": [s.timeout_seconds for s in specs],
    }


def _batches(specs: Iterable[TaskSpec | dict]) -> Iterable[list[TaskSpec]]:
    batch: list[TaskSpec] = []
    for spec in specs:
        batch.append(spec if isinstance(spec, TaskSpec) else TaskSpec(**spec))
        if len(batch) == BATCH_SIZE:
            yield batch
            batch = []
    if batch:
        yield batch


def enqueue(conn: psycopg.Connection, task: str, payload: Any = None, **options: Any) -> int:
    """Enqueues one task; returns its id. Options are the fields of TaskSpec."""
    spec = TaskSpec(task=task, payload={} if payload is None else payload, **options)
    return enqueue_many(conn, [spec])[0]


def enqueue_many(conn: psycopg.Connection, specs: Iterable[TaskSpec | dict]) -> list[int]:
    """Enqueues many tasks in batches of BATCH_SIZE rows per statement; returns ids in order."""
    ids: list[int] = []
    for batch in _batches(specs):
        rows = conn.execute(sql.ENQUEUE, _params(batch)).fetchall()
        ids.extend(row[0] for row in rows)
    return ids


async def enqueue_async(conn: psycopg.AsyncConnection, task: str, payload: Any = None, **options: Any) -> int:
    """The asyncio twin of enqueue()."""
    spec = TaskSpec(task=task, payload={} if payload is None else payload, **options)
    return (await enqueue_many_async(conn, [spec]))[0]


async def enqueue_many_async(conn: psycopg.AsyncConnection, specs: Iterable[TaskSpec | dict]) -> list[int]:
    """The asyncio twin of enqueue_many()."""
    ids: list[int] = []
    for batch in _batches(specs):
        cursor = await conn.execute(sql.ENQUEUE, _params(batch))
        ids.extend(row[0] for row in await cursor.fetchall())
    return ids
