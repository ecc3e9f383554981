"""`queueworker console`: bounded reads over a history of any size (queueworker.console.data). The
statements are in console.sql."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

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


class TaskPageRow(NamedTuple):
    id: int | None  # None: the row that only says what was scanned
    queue: str | None
    task: str | None
    state: str | None
    attempts: int | None
    max_attempts: int | None
    progress_json: str | None
    dedupe_key: str | None
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


SET_STATEMENT_TIMEOUT = _SQL.statement("set_statement_timeout", StatementTimeoutParams)
QUEUE_NAMES = _SQL.statement("queue_names", QueueNamesParams, QueueNameRow)
FINISH_RATES = _SQL.statement("finish_rates", FinishRatesParams, FinishRateRow)
TASK_PAGE = _SQL.statement("task_page", TaskPageParams, TaskPageRow)
KEY_HOLDERS = _SQL.statement("key_holders", KeyHoldersParams, KeyHolderRow)
LEASES_BY_WORKER = _SQL.statement("leases_by_worker", LeasesByWorkerParams, WorkerLeasesRow)

_SQL.check_all_declared()
