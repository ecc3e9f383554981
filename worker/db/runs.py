"""Partitioned runs (migrations 006 and 007): start (queueworker.client.producer), read, retry and finalize
(queueworker.client.runs). The statements are in runs.sql."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from .statements import JsonText, Params, SqlFile

_SQL = SqlFile("runs")


class StartRunParams(Params):
    name: str
    expected: int
    on_success: JsonText | None
    on_failure: JsonText | None
    watermark: str | None
    queues: list[str]


class StartedRunRow(NamedTuple):
    id: int


class RunsParams(Params):
    name: str | None
    limit: int


class RunRow(NamedTuple):
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
    # JSON text, decoded where it is shown: a watermark written by hand may be JSON Python cannot read
    watermark_before_json: str | None
    watermark_after_json: str | None
    started_at: datetime | None
    finished_at: datetime | None


class RunParams(Params):
    id: int


class RunTasksParams(Params):
    id: int
    limit: int | None  # None: all of them


class RunEventsParams(Params):
    id: int
    limit: int | None  # None: all of them


class RunTaskRow(NamedTuple):
    id: int
    partition: int | None
    state: str
    attempts: int
    error: str | None


class RunEventRow(NamedTuple):
    at: datetime
    from_state: str | None  # None: the run was started
    to_state: str
    detail_json: str        # counters, consolidation and alert ids, forced: written by Postgres
    by_user: str


class RetriedRunRow(NamedTuple):
    retried: int
    notified: int


class FinalizedRunRow(NamedTuple):
    finalized: bool


START_RUN = _SQL.statement("start_run", StartRunParams, StartedRunRow)
RUNS = _SQL.statement("runs", RunsParams, RunRow)
RUN = _SQL.statement("run", RunParams, RunRow)
RUN_TASKS = _SQL.statement("run_tasks", RunTasksParams, RunTaskRow)
RUN_EVENTS = _SQL.statement("run_events", RunEventsParams, RunEventRow)
RETRY_RUN = _SQL.statement("retry_run", RunParams, RetriedRunRow)
FINALIZE_RUN = _SQL.statement("finalize_run", RunParams, FinalizedRunRow)

_SQL.check_all_declared()
