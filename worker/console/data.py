"""What the console's pages show, read from Postgres (and from the cluster, when it can be reached).

Every page reads in a read-only transaction with a statement timeout, through statements that walk
an index and return a bounded number of rows, so a page costs the same on a history of ten rows or
ten million. Every stored value a page shows (payload, result, error, checkpoint, headers, an
event's detail, a watermark) is cut in Postgres, with its whole length in bytes beside it, so a page
is bounded in bytes too: neither the console nor the browser ever holds a 60 MiB payload. Workers,
run events and queue settings are read by the functions of queueworker.client the CLI uses; the
reads only the console makes are in console.sql.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from .. import jsonvalue
from ..client import runs as client_runs
from ..client.keys import key_report
from ..client.operations import queue_settings
from ..client.status import STATES, describe_flow, describe_progress, flow_control, live_workers
from ..db import statements
from ..db.console import (
    FINISH_RATES, KEY_HOLDERS, LEASES_BY_WORKER, LISTED_RUNS, QUEUE_NAMES, SET_STATEMENT_TIMEOUT, SHOWN_RUN,
    SHOWN_RUN_TASKS, SHOWN_TASK, SHOWN_TASK_EVENTS, TASK_PAGE, FinishRateRow, FinishRatesParams, KeyHolderRow,
    KeyHoldersParams, LeasesByWorkerParams, ListedRunRow, QueueNamesParams, ShownRunParams, ShownRunRow,
    ShownRunTasksParams, ShownTaskEventRow, ShownTaskEventsParams, ShownTaskParams, ShownTaskRow,
    StatementTimeoutParams, TaskPageParams, TaskPageRow, WorkerLeasesRow)
from ..db.depth import QUEUE_DEPTH, QueueDepthParams, QueueDepthRow
from ..db.flow import QueueRow
from ..db.inspect import LiveWorkerRow
from ..db.runs import RunEventRow, RunsParams, RunTaskRow

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
KEYS_SHOWN = 100  # the busiest keys of a queue; the page's totals count every key
LEASES_SHOWN = 20
JSON_SHOWN_CHARS = 64 * 1024    # each stored value (payload, result, error, ...), cut in Postgres
PROGRESS_SHOWN_CHARS = 1000     # a task's progress in the task list
ERROR_SHOWN_CHARS = 300         # an error's message in a run's task list
RUN_EVENTS_SHOWN = 1000
STATEMENT_TIMEOUT_MS = 10000
POOL_WAIT_SECONDS = 5


@dataclass
class QueueSummary:
    name: str
    depth: QueueDepthRow | None
    rates: FinishRateRow | None
    settings: QueueRow | None

    @property
    def flow(self) -> str:
        return describe_flow(flow_control(self.settings)) if self.settings and self.settings.limited else ""

    def per_minute(self, outcome: str) -> float | None:
        if self.rates is None:
            return None
        return getattr(self.rates, outcome) * 60 / self.rates.seconds


@dataclass
class TaskPage:
    tasks: list[TaskPageRow]
    scanned: int
    next_before: int | None   # where the next page starts (ids below it), None at the end
    holders: list[KeyHolderRow] = field(default_factory=list)


@dataclass
class ShownJson:
    """Stored JSON as shown: pretty when it came whole and Python can read it, else as stored; a
    value cut in Postgres says how many bytes it holds."""
    text: str
    stored_bytes: int | None = None  # the whole value's length in bytes, when what is shown was cut


def show_json(stored: str | None, stored_bytes: int | None = None) -> ShownJson | None:
    """`stored` is what Postgres sent, at most JSON_SHOWN_CHARS characters; `stored_bytes` the
    whole value's length, so a cut value is told from a whole one."""
    if stored is None:
        return None
    if stored_bytes is not None and stored_bytes > len(stored.encode("utf-8", "surrogatepass")):
        return ShownJson(stored, stored_bytes=stored_bytes)
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
        statements.execute(conn, SET_STATEMENT_TIMEOUT, StatementTimeoutParams(milliseconds=str(STATEMENT_TIMEOUT_MS)))
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

    def queues(self) -> list[QueueSummary]:
        with self.pool.connection() as conn:
            names = [row.name for row in statements.fetch(conn, QUEUE_NAMES, QueueNamesParams(limit=MAX_QUEUES))]
            depths = {row.queue: row for row in statements.fetch(conn, QUEUE_DEPTH, QueueDepthParams(
                queues=names, lookaheads=[None] * len(names), cap=DEPTH_CAP, throughput=False))}
            rates = {row.queue: row for row in statements.fetch(conn, FINISH_RATES,
                                                                FinishRatesParams(window=RATE_WINDOW_SECONDS))}
            settings = {row.name: row for row in queue_settings(conn)}
        return [QueueSummary(name, depths.get(name), rates.get(name), settings.get(name)) for name in names]

    def tasks(self, *, queue: str | None, state: str | None, task: str | None, dedupe_key: str | None,
              before: int | None) -> TaskPage:
        with self.pool.connection() as conn:
            rows = statements.fetch(conn, TASK_PAGE, TaskPageParams(
                before=BIGINT_MAX if before is None else before, partition_states=partition_states(state),
                scan=SCAN_BUDGET, queue=queue, state=state, task=task, dedupe_key=dedupe_key, limit=PAGE_SIZE,
                progress_chars=PROGRESS_SHOWN_CHARS))
            holders = statements.fetch(conn, KEY_HOLDERS, KeyHoldersParams(dedupe_key=dedupe_key)) if dedupe_key else []
        tasks = [row for row in rows if row.id is not None]
        scanned, lowest = rows[0].scanned, rows[0].lowest_scanned
        if len(tasks) == PAGE_SIZE:
            next_before = tasks[-1].id
        else:
            next_before = lowest if scanned == SCAN_BUDGET else None
        return TaskPage(tasks, scanned, next_before, holders)

    def task(self, task_id: int) -> tuple[ShownTaskRow | None, list[ShownTaskEventRow]]:
        with self.pool.connection() as conn:
            found = statements.fetch_one(conn, SHOWN_TASK, ShownTaskParams(id=task_id, chars=JSON_SHOWN_CHARS))
            if found is None:
                return None, []
            return found, statements.fetch(conn, SHOWN_TASK_EVENTS, ShownTaskEventsParams(
                id=task_id, limit=EVENTS_SHOWN, chars=JSON_SHOWN_CHARS))

    def workers(self) -> tuple[list[LiveWorkerRow], dict[str, WorkerLeasesRow]]:
        with self.pool.connection() as conn:
            workers = live_workers(conn)
            leases = {row.worker: row for row in statements.fetch(conn, LEASES_BY_WORKER,
                                                                  LeasesByWorkerParams(shown=LEASES_SHOWN))}
        return workers, leases

    def keys(self, queue: str) -> dict[str, Any]:
        with self.pool.connection() as conn:
            return key_report(conn, queue, KEYS_SHOWN)

    def runs(self, name: str | None) -> list[ListedRunRow]:
        with self.pool.connection() as conn:
            return statements.fetch(conn, LISTED_RUNS, RunsParams(name=name, limit=RUNS_SHOWN))

    def run(self, run_id: int) -> tuple[ShownRunRow | None, list[RunTaskRow], list[RunEventRow]]:
        with self.pool.connection() as conn:
            found = statements.fetch_one(conn, SHOWN_RUN, ShownRunParams(id=run_id, chars=JSON_SHOWN_CHARS))
            if found is None:
                return None, [], []
            tasks = statements.fetch(conn, SHOWN_RUN_TASKS, ShownRunTasksParams(
                id=run_id, limit=RUN_TASKS_SHOWN, error_chars=ERROR_SHOWN_CHARS))
            return found, tasks, client_runs.run_events(conn, run_id, limit=RUN_EVENTS_SHOWN)
