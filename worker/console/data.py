"""What the console's pages show, read from Postgres (and from the cluster, when it can be reached).

Every page reads in a read-only transaction with a statement timeout, through statements of
queueworker.sql that walk an index and return a bounded number of rows (see the `console` section
there), so a page costs the same on a history of ten rows or ten million.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from .. import jsonvalue
from ..db import sql
from ..db.connection import typed_rows
from ..client.operations import queue_settings
from ..client.status import STATES, describe_flow, describe_progress, flow_control

FINISHED_STATES = ("succeeded", "failed", "cancelled")
ACTIVE_STATES = tuple(s for s in STATES if s not in FINISHED_STATES)
BIGINT_MAX = 2**63 - 1
PAGE_SIZE = 50
SCAN_BUDGET = 10000          # tasks read per page of the task list, at most
DEPTH_CAP = 100000           # live tasks counted per queue and state, at most
RATE_WINDOW_SECONDS = 300    # finish rates: over the last five minutes
MAX_QUEUES = 500
EVENTS_SHOWN = 1000
RUN_TASKS_SHOWN = 1000
RUNS_SHOWN = 100
LEASES_SHOWN = 20
JSON_SHOWN_CHARS = 64 * 1024
STATEMENT_TIMEOUT_MS = 10000
POOL_WAIT_SECONDS = 5


@dataclass
class QueueSummary:
    name: str
    depth: sql.QueueDepthRow | None
    rates: sql.ConsoleFinishRateRow | None
    settings: sql.QueueRow | None

    @property
    def flow(self) -> str:
        return describe_flow(flow_control(self.settings)) if self.settings and self.settings.limited else ""

    def per_minute(self, outcome: str) -> float | None:
        if self.rates is None:
            return None
        return getattr(self.rates, outcome) * 60 / self.rates.seconds


@dataclass
class TaskPage:
    tasks: list[sql.ConsoleTaskRow]
    scanned: int
    next_before: int | None   # where the next page starts (ids below it), None at the end
    holders: list[sql.ConsoleKeyHolderRow] = field(default_factory=list)


@dataclass
class ShownJson:
    """Stored JSON as shown: pretty when Python can read it and it is small, else as stored,
    cut at JSON_SHOWN_CHARS."""
    text: str
    truncated_from: int | None = None  # the stored length, when cut


def show_json(stored: str | None) -> ShownJson | None:
    if stored is None:
        return None
    if len(stored) > JSON_SHOWN_CHARS:
        return ShownJson(stored[:JSON_SHOWN_CHARS], truncated_from=len(stored))
    try:
        pretty = json.dumps(jsonvalue.decode(stored), indent=2, ensure_ascii=False)
    except (jsonvalue.Undecodable, RecursionError, ValueError):
        return ShownJson(stored)
    return ShownJson(pretty if len(pretty) <= JSON_SHOWN_CHARS else stored)


def progress(progress_json: str | None) -> str:
    return describe_progress(progress_json)


def partition_states(state: str | None) -> list[str]:
    """The states of the partition(s) a state filter reads: Postgres prunes the other partition."""
    if state is None:
        return list(STATES)
    return list(FINISHED_STATES if state in FINISHED_STATES else ACTIVE_STATES)


class ConsoleDatabase:
    """A small pool of read-only connections."""

    def __init__(self, dsn: str, max_size: int = 4):
        self.dsn = dsn
        self.pool = ConnectionPool(dsn, min_size=1, max_size=max_size, open=False, configure=self._configure,
                                   timeout=POOL_WAIT_SECONDS,
                                   kwargs={"application_name": "queueworker-console", "connect_timeout": 10})

    @staticmethod
    def _configure(conn: psycopg.Connection) -> None:
        conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        conn.commit()
        conn.read_only = True

    def open(self) -> None:
        self.pool.open(wait=False)

    def close(self) -> None:
        self.pool.close()

    def why_unavailable(self) -> psycopg.Error:
        """The error of a direct connection attempt: what the pool, which only says that it waited
        in vain, met (a wrong password, a server down)."""
        try:
            psycopg.connect(self.dsn, connect_timeout=POOL_WAIT_SECONDS).close()
        except psycopg.Error as exc:
            return exc
        return psycopg.OperationalError("no database connection became free in time")

    def _rows(self, statement: str, params: dict[str, Any], row: type) -> list:
        with self.pool.connection() as conn, conn.cursor(row_factory=typed_rows(row)) as cursor:
            return cursor.execute(statement, params).fetchall()

    def queues(self) -> list[QueueSummary]:
        names = [r.name for r in self._rows(sql.CONSOLE_QUEUE_NAMES, {"limit": MAX_QUEUES}, sql.ConsoleQueueNameRow)]
        depths = {r.queue: r for r in self._rows(
            sql.QUEUE_DEPTH, {"queues": names, "lookaheads": [None] * len(names), "cap": DEPTH_CAP,
                              "throughput": False}, sql.QueueDepthRow)}
        rates = {r.queue: r for r in self._rows(sql.CONSOLE_FINISH_RATES, {"window": RATE_WINDOW_SECONDS},
                                                 sql.ConsoleFinishRateRow)}
        with self.pool.connection() as conn:
            settings = {r.name: r for r in queue_settings(conn)}
        return [QueueSummary(name, depths.get(name), rates.get(name), settings.get(name)) for name in names]

    def tasks(self, *, queue: str | None, state: str | None, task: str | None, dedupe_key: str | None,
              before: int | None) -> TaskPage:
        rows = self._rows(sql.CONSOLE_TASKS, {
            "before": BIGINT_MAX if before is None else before, "partition_states": partition_states(state),
            "scan": SCAN_BUDGET, "queue": queue, "state": state, "task": task, "dedupe_key": dedupe_key,
            "limit": PAGE_SIZE}, sql.ConsoleTaskRow)
        tasks = [r for r in rows if r.id is not None]
        scanned, lowest = rows[0].scanned, rows[0].lowest_scanned
        if len(tasks) == PAGE_SIZE:
            next_before = tasks[-1].id
        else:
            next_before = lowest if scanned == SCAN_BUDGET else None
        holders = self._rows(sql.CONSOLE_KEY_HOLDERS, {"dedupe_key": dedupe_key},
                             sql.ConsoleKeyHolderRow) if dedupe_key else []
        return TaskPage(tasks, scanned, next_before, holders)

    def task(self, task_id: int) -> tuple[sql.TaskRow | None, list[sql.TaskEventRow]]:
        found = self._rows(sql.TASK, {"id": task_id}, sql.TaskRow)
        if not found:
            return None, []
        return found[0], self._rows(sql.CONSOLE_TASK_EVENTS, {"id": task_id, "limit": EVENTS_SHOWN}, sql.TaskEventRow)

    def workers(self) -> tuple[list[sql.LiveWorkerRow], dict[str, sql.ConsoleWorkerLeasesRow]]:
        workers = self._rows(sql.LIVE_WORKERS, {"queue": None}, sql.LiveWorkerRow)
        leases = {r.worker: r for r in self._rows(sql.CONSOLE_WORKER_LEASES, {"shown": LEASES_SHOWN},
                                                  sql.ConsoleWorkerLeasesRow)}
        return workers, leases

    def runs(self, name: str | None) -> list[sql.RunRow]:
        return self._rows(sql.RUNS, {"name": name, "limit": RUNS_SHOWN}, sql.RunRow)

    def run(self, run_id: int) -> tuple[sql.RunRow | None, list[sql.RunTaskRow], list[sql.RunEventRow]]:
        found = self._rows(sql.RUN, {"id": run_id}, sql.RunRow)
        if not found:
            return None, [], []
        return (found[0], self._rows(sql.CONSOLE_RUN_TASKS, {"id": run_id, "limit": RUN_TASKS_SHOWN}, sql.RunTaskRow),
                self._rows(sql.RUN_EVENTS, {"id": run_id}, sql.RunEventRow))
