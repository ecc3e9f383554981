"""What an application's own tests ask of the queue (queueworker.testing). The statements are in
testing.sql."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from .inspect import TaskRow
from .statements import JsonText, NoParams, Params, SqlFile

_SQL = SqlFile("testing")


class EnqueuedParams(Params):
    task: str | None
    queue: str | None
    key: str | None
    priority: int | None
    payload: JsonText | None  # matched by containment
    limit: int


class EnqueuedRow(NamedTuple):
    id: int
    queue: str
    task: str
    state: str
    payload_json: str
    priority: int
    key: str | None
    run_after: datetime


class QueueRow(NamedTuple):
    queue: str


class DrainParams(Params):
    queues: list[str]
    worker: UUID


class DrainLeftRow(NamedTuple):
    due: int
    running: int


class DrainedParams(Params):
    worker: UUID


ENQUEUED = _SQL.statement("enqueued", EnqueuedParams, EnqueuedRow)
DUE_QUEUES = _SQL.statement("due_queues", NoParams, QueueRow)
DRAIN_LEFT = _SQL.statement("drain_left", DrainParams, DrainLeftRow)
DRAINED = _SQL.statement("drained", DrainedParams, TaskRow)

_SQL.check_all_declared()
