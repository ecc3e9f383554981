"""What operators do to tasks that exist: retry and cancel (queueworker.client.operations). The
statements are in tasks.sql."""

from __future__ import annotations

from typing import NamedTuple

from .inspect import TaskIdsParams, TaskParams
from .statements import Params, SqlFile

_SQL = SqlFile("tasks")


class RetriedTaskRow(NamedTuple):
    id: int
    queue: str
    attempts: int
    max_attempts: int


class CancelTasksParams(Params):
    ids: list[int] | None  # None: every task of the queue
    queue: str | None
    states: list[str]
    reason: str


class CancelledRow(NamedTuple):
    id: int
    was: str        # the state it was cancelled from
    notified: int   # running tasks whose worker was told


class DedupeHolderRow(NamedTuple):
    id: int
    state: str
    queue: str
    dedupe_key: str


class TaskStateRow(NamedTuple):
    id: int
    state: str


RETRY_TASK = _SQL.statement("retry_task", TaskParams, RetriedTaskRow)
CANCEL_TASKS = _SQL.statement("cancel_tasks", CancelTasksParams, CancelledRow)
DEDUPE_HOLDER = _SQL.statement("dedupe_holder", TaskParams, DedupeHolderRow)
TASK_STATES = _SQL.statement("task_states", TaskIdsParams, TaskStateRow)

_SQL.check_all_declared()
