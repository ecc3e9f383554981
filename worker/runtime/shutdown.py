"""The steps of a worker's shutdown that stand on their own; `Worker` runs them in order when it
drains (docs/state-machine.md, Draining): stop the fetch loop, then flush, release and deregister,
each retried within what is left of the shutdown budget, severing connections whose database no
longer answers so that nothing waits on it while the worker stops; and the end of the worker's own
event loop (`run_to_exit`), which no task that ignores its cancellation can hold up."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Protocol, TypeVar

from .supervisor import ErrorStreak

log = logging.getLogger("queueworker.worker")

# After severing connections, the most their statements are given to fail on their own before
# their callers are cancelled. psycopg looks at a socket every 0.1 s, when the event loop gets to
# it, which on a busy machine can take longer.
SEVERED_SETTLE_SECONDS = 2.0
SEVERED_POLL_SECONDS = 0.02
# Once the worker has stopped, the most the tasks still on its loop are given to end after they are
# cancelled (one loop turn is enough for any task that honours it), and the most the loop's thread
# pool is given to finish what it runs.
STRAGGLER_SECONDS = 1.0

T = TypeVar("T")


class Severable(Protocol):
    def sever(self) -> None: ...

    def severing(self) -> bool: ...


async def sever(connections: Iterable[Severable]) -> None:
    """Makes the statements under way on `connections` fail now, and returns once each has noticed
    (at most SEVERED_SETTLE_SECONDS later), so that cancelling their callers is immediate. A caller
    cancelled while its statement still waits would make psycopg ask the server, which does not
    answer, to cancel it, and wait up to 10 s for the answer."""
    severed = list(connections)
    for conn in severed:
        conn.sever()
    loop = asyncio.get_running_loop()
    give_up = loop.time() + SEVERED_SETTLE_SECONDS
    while any(conn.severing() for conn in severed) and loop.time() < give_up:
        await asyncio.sleep(SEVERED_POLL_SECONDS)


async def stop_fetching(fetch: asyncio.Task, deadline: float, claim_conn: Severable) -> bool:
    """Lets the fetch loop stop on its own (cancelling it mid-claim could lose claimed rows);
    if a hung claim keeps it past the drain deadline (loop time), cancels it, and the stop is not
    clean (False)."""
    try:
        async with asyncio.timeout_at(max(deadline, asyncio.get_running_loop().time())):
            await asyncio.gather(fetch, return_exceptions=True)
        return True
    except TimeoutError:
        await sever([claim_conn])
        fetch.cancel()
        await asyncio.gather(fetch, return_exceptions=True)
        log.error("a claim was still waiting for the database at the drain deadline; its tasks, if it "
                  "took any, return to the queue when their lease expires")
        return False


async def within_budget(end: float, what: str, step: Callable[[float], Awaitable[Any]], dsn: str) -> bool:
    """Retries a shutdown step until it succeeds (True) or the shutdown budget, which runs out at
    `end` (loop time), is spent. The step is given the time left and passes it on as its
    statements' deadline, which severs a hung statement at once (cancelling one would wait for the
    server)."""
    loop = asyncio.get_running_loop()
    errors = ErrorStreak(what, log, dsn, cap_seconds=1.0)
    while True:
        remaining = end - loop.time()
        if remaining <= 0:
            log.error("shutdown %s did not finish within the shutdown budget", what)
            return False
        try:
            await step(remaining)
            return True
        except Exception as exc:  # noqa: BLE001 - logged and retried within the budget
            await asyncio.sleep(min(errors.record(exc), max(0.0, end - loop.time())))


def run_to_exit(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main), but the end of the loop is bounded. asyncio.run cancels every task left
    and waits for all of them: a task that ignores its cancellation (an async handler that catches
    CancelledError and goes on) kept a worker that had stopped, its leases released, from ever
    exiting. Here the tasks left are cancelled and given STRAGGLER_SECONDS; those still running
    are named in an error and left behind with the loop, which the process's exit ends."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.wait(left, timeout=STRAGGLER_SECONDS))
            stragglers = [task for task in left if not task.done()]
            if stragglers:
                log.error("%d task(s) did not end when cancelled at exit, left running: %s (an async handler "
                          "that catches CancelledError and goes on?)", len(stragglers),
                          ", ".join(sorted(_describe(task) for task in stragglers)))
                for task in stragglers:  # named above: no "Task was destroyed but it is pending!" besides
                    task._log_destroy_pending = False  # type: ignore[attr-defined]
            loop.run_until_complete(loop.shutdown_asyncgens())
            executor = loop.create_task(loop.shutdown_default_executor())
            loop.run_until_complete(asyncio.wait({executor}, timeout=STRAGGLER_SECONDS))
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _describe(task: asyncio.Task[Any]) -> str:
    """A task as the error names it: its name and its coroutine's."""
    coro = task.get_coro()
    return f"{task.get_name()} ({getattr(coro, '__qualname__', type(coro).__name__)})"
