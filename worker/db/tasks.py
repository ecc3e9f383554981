"""What operators do to tasks that exist: retry and cancel (queueworker.client.operations). The statements are in tasks.sql."""

from __future__ import annotations

from typing import NamedTuple

from .statements import Params, SqlFile

_SQL = SqlFile("tasks")


class RetryTaskParams(Params):
    id: int


class RetriedTaskRow(NamedTuple):
    id: int
    queue: str
    attempts: int
    max_attempts: int


class CancelTasksParams(Params):
    ids: list[int] | None
    queue: str
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


class TaskStatesParams(Params):
    ids: list[int]


class TaskStateRow(NamedTuple):
    id: int
    state: str


RETRY_TASK = _SQL.statement("retry_task", RetryTaskParams, RetriedTaskRow)
CANCEL_TASKS = _SQL.statement("cancel_tasks", CancelTasksParams, CancelledRow)
DEDUPE_HOLDER = _SQL.statement("dedupe_holder", RetryTaskParams, DedupeHolderRow)
TASK_STATES = _SQL.statement("task_states", TaskStatesParams, TaskStateRow)

_SQL.check_all_declared()
