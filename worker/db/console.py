"""`queueworker console`: bounded reads over a history of any size (queueworker.console.data). The
statements are in console.sql."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from .runs import RunsParams, RunTaskRow
from .statements import Params, SqlFile

_SQL = SqlFile("console")


class StatementTimeoutParams(Params):
    milliseconds: str


class QueueNamesParams(Params):
    limit: int


class QueueNameRow(NamedTuple):
    name: str


class FinishRatesParams(Params):
    window: float  # seconds


class FinishRateRow(NamedTuple):
    queue: str
    succeeded: int
    failed: int
    cancelled: int
    seconds: float  # what the counts cover


class TaskPageParams(Params):
    before: int
    partition_states: list[str]
    scan: int
    queue: str | None
    state: str | None
    task: str | None
    dedupe_key: str | None
    limit: int
    progress_chars: int


class TaskPageRow(NamedTuple):
    id: int | None  # None: the row that only says what was scanned
    queue: str | None
    task: str | None
    state: str | None
    attempts: int | None
    max_attempts: int | None
    progress_json: str | None
    dedupe_key: str | None
    key: str | None
    lease_owner: str | None
    created_at: datetime | None
    updated_at: datetime | None
    scanned: int
    lowest_scanned: int | None


class KeyHoldersParams(Params):
    dedupe_key: str


class KeyHolderRow(NamedTuple):
    id: int
    queue: str
    state: str


class LeasesByWorkerParams(Params):
    shown: int


class WorkerLeasesRow(NamedTuple):
    worker: str
    leases: int
    task_ids: list[int]


class ShownTaskParams(Params):
    id: int
    chars: int  # each stored value is cut at this many characters


class ShownTaskRow(NamedTuple):
    """A task as its page shows it: each JSON value's text cut in Postgres, and its whole length
    in bytes (None where the value is NULL)."""
    id: int
    queue: str
    task: str
    state: str
    attempts: int
    max_attempts: int
    priority: int
    payload_json: str
    payload_bytes: int
    result_json: str | None
    result_bytes: int | None
    error_json: str | None
    error_bytes: int | None
    checkpoint_json: str | None
    checkpoint_bytes: int | None
    headers_json: str | None
    headers_bytes: int | None
    progress_json: str | None
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


class ShownTaskEventsParams(Params):
    id: int
    limit: int
    chars: int


class ShownTaskEventRow(NamedTuple):
    at: datetime
    from_state: str | None  # None: the task was enqueued
    to_state: str
    worker: UUID | None
    lease_token: int
    detail_json: str | None
    detail_bytes: int | None
    by_user: str | None  # the login that caused it; None for rows written before schema version 16


class ListedRunRow(NamedTuple):
    id: int
    name: str
    state: str
    expected: int
    succeeded: int
    failed: int
    cancelled: int
    started_at: datetime | None
    finished_at: datetime | None


class ShownRunParams(Params):
    id: int
    chars: int


class ShownRunRow(NamedTuple):
    id: int
    name: str
    state: str
    expected: int
    succeeded: int
    failed: int
    cancelled: int
    success_task_id: int | None
    failure_task_id: int | None
    forced: bool
    watermark: str | None
    watermark_before_json: str | None
    watermark_before_bytes: int | None
    watermark_after_json: str | None
    watermark_after_bytes: int | None
    started_at: datetime | None
    finished_at: datetime | None


class ShownRunTasksParams(Params):
    id: int
    limit: int
    error_chars: int


SET_STATEMENT_TIMEOUT = _SQL.statement("set_statement_timeout", StatementTimeoutParams)
QUEUE_NAMES = _SQL.statement("queue_names", QueueNamesParams, QueueNameRow)
FINISH_RATES = _SQL.statement("finish_rates", FinishRatesParams, FinishRateRow)
TASK_PAGE = _SQL.statement("task_page", TaskPageParams, TaskPageRow)
KEY_HOLDERS = _SQL.statement("key_holders", KeyHoldersParams, KeyHolderRow)
LEASES_BY_WORKER = _SQL.statement("leases_by_worker", LeasesByWorkerParams, WorkerLeasesRow)
SHOWN_TASK = _SQL.statement("task_shown", ShownTaskParams, ShownTaskRow)
SHOWN_TASK_EVENTS = _SQL.statement("task_events_shown", ShownTaskEventsParams, ShownTaskEventRow)
LISTED_RUNS = _SQL.statement("runs_shown", RunsParams, ListedRunRow)
SHOWN_RUN = _SQL.statement("run_shown", ShownRunParams, ShownRunRow)
SHOWN_RUN_TASKS = _SQL.statement("run_tasks_shown", ShownRunTasksParams, RunTaskRow)

_SQL.check_all_declared()
