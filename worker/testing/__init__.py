"""Helpers for an application's own tests: what its code enqueued, and running it.

- `assert_enqueued(conn, task=..., payload=..., queue=...)` passes when a task waiting to run
  matches every filter given and fails listing what is there instead; `refute_enqueued` is its
  opposite; `enqueued` returns the matches.
- `drain(conn, queue=None)` runs the tasks due now through a real worker in this process (the
  claim, heartbeat, completion and retry statements a deployed worker runs, and the handlers
  registered with `@task`) until nothing is due, and returns the tasks it ran, as stored after.
- The pytest plugin (`queueworker.testing.plugin`, active wherever queueworker is installed)
  gives each test a throwaway migrated database: the `queueworker_db` fixture (docs/testing-tasks.md).
"""

from __future__ import annotations

import asyncio
import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from ..client.results import TaskInfo, task_info
from ..db import statements
from ..db.statements import NO_PARAMS
from ..db.testing import DRAIN_LEFT, DRAINED, DUE_QUEUES, ENQUEUED, DrainedParams, DrainParams, EnqueuedParams
from ..events import wait_event
from ..jsonvalue import decode

__all__ = ["DrainTimeout", "assert_enqueued", "drain", "enqueued", "refute_enqueued"]

# How many waiting tasks a failed assertion lists, and how long drain waits for its tasks by default.
SHOWN = 20
DRAIN_TIMEOUT_SECONDS = 60.0


# JSON's escape of a NUL character (after an even number of backslashes: not an escaped backslash).
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class DrainTimeout(AssertionError):
    """drain's tasks were still due or running when its time ran out."""


def enqueued(conn: psycopg.Connection, task: str | None = None, payload: Any = None, queue: str | None = None,
             *, key: str | None = None, priority: int | None = None, limit: int = 1000) -> list[dict[str, Any]]:
    """The tasks waiting to run (pending, retrying or blocked) that match every filter given, oldest
    first, each as a dict (id, queue, task, state, payload, priority, key, run_after). `payload`
    matches by containment: the task's payload has those fields with those values (and maybe more)."""
    try:  # a payload no task can hold (NaN, a NUL character) matches none: said here, before any round trip
        wanted = None if payload is None else json.dumps(payload, allow_nan=False)
    except ValueError as exc:
        raise ValueError(f"payload to match is not JSON a task can hold: {exc}") from None
    if wanted is not None and _JSON_NUL.search(wanted):
        raise ValueError("payload to match is not JSON a task can hold: it has a NUL character")
    params = EnqueuedParams(task=task, queue=queue, key=key, priority=priority, payload=wanted, limit=limit)
    return [{**row._asdict(), "payload": decode(row.payload_json)}
            for row in statements.fetch(conn, ENQUEUED, params)]


def assert_enqueued(conn: psycopg.Connection, task: str | None = None, payload: Any = None,
                    queue: str | None = None, *, key: str | None = None, priority: int | None = None
                    ) -> dict[str, Any]:
    """Fails unless a task waiting to run matches every filter given; returns the first that does."""
    found = enqueued(conn, task, payload, queue, key=key, priority=priority, limit=1)
    if found:
        return found[0]
    wanted = _describe(task=task, payload=payload, queue=queue, key=key, priority=priority)
    waiting = enqueued(conn, limit=SHOWN)
    listing = "".join(f"\n  {_one_line(t)}" for t in waiting) or " none"
    raise AssertionError(f"no task waiting to run matches {wanted}; waiting to run:{listing}")


def refute_enqueued(conn: psycopg.Connection, task: str | None = None, payload: Any = None,
                    queue: str | None = None, *, key: str | None = None, priority: int | None = None) -> None:
    """Fails if a task waiting to run matches every filter given, naming it."""
    found = enqueued(conn, task, payload, queue, key=key, priority=priority, limit=SHOWN)
    if found:
        wanted = _describe(task=task, payload=payload, queue=queue, key=key, priority=priority)
        listing = "".join(f"\n  {_one_line(t)}" for t in found)
        raise AssertionError(f"{len(found)} task(s) waiting to run match {wanted}:{listing}")


def drain(conn: psycopg.Connection, queue: str | None = None, *, registry: Any = None,
          timeout: float = DRAIN_TIMEOUT_SECONDS) -> list[TaskInfo]:
    """Runs the tasks due now in `queue` (else in every queue that has one) through a real worker
    in this process, with `registry`'s handlers (default: those `@task` registered), until none is
    due and none is running; returns every task it ran, as stored afterwards, in id order. What they
    enqueue and is due at once runs too; a retry that backs off, a delayed task and a blocked one
    wait. A task no handler knows is handed back, as a deployed worker hands it back for a newer one
    that may know it: it comes back `pending`, its error saying so. The worker has connections of its own, so it sees
    only committed tasks: an open transaction on `conn` is refused. Raises DrainTimeout, naming what
    is left, when that takes longer than `timeout` seconds.

    Synchronous; from an async test, `await asyncio.to_thread(drain, conn)`."""
    status = conn.info.transaction_status
    if status != psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError("drain runs the tasks on connections of its own, which see only committed work: commit "
                           "the transaction that enqueued them first (the queueworker_db fixture's connection "
                           "commits every statement)")
    dsn = psycopg.conninfo.make_conninfo(conn.info.dsn, password=conn.info.password)
    queues = [queue] if queue is not None else [row.queue for row in statements.fetch(conn, DUE_QUEUES, NO_PARAMS)]
    if not queues:
        return []
    # A thread of its own, so that drain works whether or not the caller's thread runs an event loop;
    # its loop ends as a worker's does, whatever a handler that ignores cancellation does. Imported
    # here, as the worker is (below): a test suite that never drains loads no worker.
    from ..runtime.shutdown import run_to_exit
    with ThreadPoolExecutor(1, thread_name_prefix="queueworker-drain") as pool:
        return pool.submit(run_to_exit, _drain(dsn, queues, registry, timeout)).result()


async def _drain(dsn: str, queues: list[str], registry: Any, timeout: float) -> list[TaskInfo]:
    from ..runtime.worker import Worker
    from ..settings import WorkerSettings

    worker = Worker(dsn, WorkerSettings(queues=tuple(queues)), registry)
    moved = asyncio.Event()
    for signal in (worker.signals.claimed, worker.signals.completing):
        signal.watch(lambda _value: moved.set())
    running = asyncio.create_task(worker.run())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        try:
            while not running.done():
                left = (await statements.fetch_async(conn, DRAIN_LEFT, DrainParams(
                    queues=queues, worker=worker.identity.id)))[0]
                if left.due == 0 and left.running == 0:
                    break
                if loop.time() >= deadline:
                    worker.request_stop()  # the second request below stops the attempts still running at once
                    raise DrainTimeout(f"drain of {', '.join(queues)} gave up after {timeout:g} s with "
                                       f"{left.due} task(s) due and {left.running} running")
                moved.clear()
                # A claim or a completion is what changes the count; a look every 50 ms besides.
                await wait_event(moved, 0.05)
        finally:
            worker.request_stop()
            exit_code = await running
        if exit_code != 0:
            raise RuntimeError(f"drain's worker stopped with exit code {exit_code}: see its log lines")
        rows = await statements.fetch_async(conn, DRAINED, DrainedParams(worker=worker.identity.id))
    return [task_info(row) for row in rows]


def _describe(**filters: Any) -> str:
    given = {name: value for name, value in filters.items() if value is not None}
    return ", ".join(f"{name}={value!r}" for name, value in given.items()) or "anything"


def _one_line(task: dict[str, Any]) -> str:
    key = f" key={task['key']!r}" if task["key"] is not None else ""
    return (f"#{task['id']} {task['task']} in {task['queue']} ({task['state']}, priority {task['priority']}{key}) "
            f"payload={json.dumps(task['payload'], sort_keys=True)[:200]}")
