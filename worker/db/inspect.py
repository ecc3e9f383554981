"""Reading tasks and workers back: `get_task` and `wait_for`, `queueworker show`, `list` and `status`, the
console and the demo. The statements are in inspect.sql."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from .statements import Params, SqlFile

_SQL = SqlFile("inspect")


class TaskParams(Params):
    id: int


class TaskRow(NamedTuple):
    id: int
    queue: str
    task: str
    state: str
    attempts: int
    max_attempts: int
    priority: int
    payload_json: str
    result_json: str | None
    error_json: str | None
    progress_json: str | None
    checkpoint_json: str | None
    dedupe_key: str | None
    key: str | None  # TaskSpec.key (migration 018)
    run_id: int | None
    run_partition: int | None
    continued_from: int | None
    lease_owner: UUID | None
    created_at: datetime
    run_after: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime


class TaskEventsParams(Params):
    id: int
    limit: int | None  # None: all of them


class TaskEventRow(NamedTuple):
    at: datetime
    from_state: str | None  # None: the task was enqueued
    to_state: str
    worker: UUID | None
    lease_token: int
    detail_json: str | None
    by_user: str | None  # the login that caused it; None for rows written before schema version 16


class ListTasksParams(Params):
    queue: str | None
    state: str | None
    limit: int


class ListedTaskRow(NamedTuple):
    id: int
    queue: str
    task: str
    state: str
    attempts: int
    max_attempts: int
    progress_json: str | None
    created_at: datetime
    updated_at: datetime
    key: str | None


class QueueFilterParams(Params):
    queue: str | None  # None: every queue


class StuckTaskRow(NamedTuple):
    id: int
    queue: str
    task: str
    lease_owner: UUID | None
    expired_for: float


class StatusCountRow(NamedTuple):
    queue: str
    state: str
    n: int


class OldestPendingRow(NamedTuple):
    queue: str
    age: float


class LiveWorkerRow(NamedTuple):
    id: str
    hostname: str
    pod_name: str | None
    pod_namespace: str | None
    pid: int
    queues: list[str]
    concurrency: int
    running: int
    draining: bool
    heartbeat_age_seconds: float
    started_at: datetime


class TaskIdsParams(Params):
    ids: list[int]


class StateCountRow(NamedTuple):
    state: str
    n: int


class WorkerLoadsParams(Params):
    hostname: str
    pids: list[int]


class WorkerLoadRow(NamedTuple):
    pid: int
    leased: int


TASK = _SQL.statement("task", TaskParams, TaskRow)
TASK_EVENTS = _SQL.statement("task_events", TaskEventsParams, TaskEventRow)
LIST_TASKS = _SQL.statement("list_tasks", ListTasksParams, ListedTaskRow)
STUCK_TASKS = _SQL.statement("stuck_tasks", QueueFilterParams, StuckTaskRow)
STATUS_COUNTS = _SQL.statement("status_counts", QueueFilterParams, StatusCountRow)
OLDEST_PENDING_AGE = _SQL.statement("oldest_pending_age", QueueFilterParams, OldestPendingRow)
LIVE_WORKERS = _SQL.statement("live_workers", QueueFilterParams, LiveWorkerRow)
TASK_STATE_COUNTS = _SQL.statement("task_state_counts", TaskIdsParams, StateCountRow)
WORKER_LOADS = _SQL.statement("worker_loads", WorkerLoadsParams, WorkerLoadRow)

_SQL.check_all_declared()
