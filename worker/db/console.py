"""`queueworker console`: bounded reads over a history of any size (queueworker.console.data). The statements are in console.sql."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from .inspect import TaskEventRow
from .runs import RunTaskRow
from .statements import Params, SqlFile

_SQL = SqlFile("console")


class ConsoleQueueNamesParams(Params):
    limit: int


class ConsoleQueueNameRow(NamedTuple):
    name: str


class ConsoleFinishRatesParams(Params):
    window: float


class ConsoleFinishRateRow(NamedTuple):
    queue: str
    succeeded: int
    failed: int
    cancelled: int
    seconds: float


class ConsoleTasksParams(Params):
    before: int
    partition_states: list[str]
    scan: int
    queue: str | None
    state: str | None
    task: str | None
    dedupe_key: str | None
    limit: int


class ConsoleTaskRow(NamedTuple):
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


class ConsoleKeyHoldersParams(Params):
    dedupe_key: str


class ConsoleKeyHolderRow(NamedTuple):
    id: int
    queue: str
    state: str


class ConsoleWorkerLeasesParams(Params):
    shown: int


class ConsoleWorkerLeasesRow(NamedTuple):
    worker: str
    leases: int
    task_ids: list[int]


class ConsoleByIdParams(Params):
    id: int
    limit: int


CONSOLE_QUEUE_NAMES = _SQL.statement("console_queue_names", ConsoleQueueNamesParams, ConsoleQueueNameRow)
CONSOLE_FINISH_RATES = _SQL.statement("console_finish_rates", ConsoleFinishRatesParams, ConsoleFinishRateRow)
CONSOLE_TASKS = _SQL.statement("console_tasks", ConsoleTasksParams, ConsoleTaskRow)
CONSOLE_KEY_HOLDERS = _SQL.statement("console_key_holders", ConsoleKeyHoldersParams, ConsoleKeyHolderRow)
CONSOLE_WORKER_LEASES = _SQL.statement("console_worker_leases", ConsoleWorkerLeasesParams, ConsoleWorkerLeasesRow)
CONSOLE_TASK_EVENTS = _SQL.statement("console_task_events", ConsoleByIdParams, TaskEventRow)
CONSOLE_RUN_TASKS = _SQL.statement("console_run_tasks", ConsoleByIdParams, RunTaskRow)

_SQL.check_all_declared()
