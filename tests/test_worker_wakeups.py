"""Wake-ups cost constant memory: however many tasks are announced as due later, a worker keeps
one timer, for the earliest of them (unit tier). A listener that starts listening looks again for
what it may have missed, and an idle worker that listens costs the database little: notifications
do the waking (integration tier)."""

from __future__ import annotations

import asyncio
import random
import time
from typing import NamedTuple

import psycopg
import pytest

from queueworker import enqueue_many

from queueworker.db import cron, flow
from queueworker.db.connection import PASS_ON_SLICE, DutyConnection
from queueworker.db.statements import NO_PARAMS, NoParams, Statement
from queueworker.runtime.handlers import Registry
from queueworker.settings import WorkerSettings
from queueworker.runtime.worker import Worker
from tests.support import run_worker_until, scalar, until

DSN = "postgresql://app@127.0.0.1:1/app"  # never connected to


def _live_timers(loop: asyncio.AbstractEventLoop) -> list[asyncio.TimerHandle]:
    return [handle for handle in loop._scheduled if not handle.cancelled()]  # type: ignore[attr-defined]


def test_many_future_due_times_keep_one_timer_for_the_earliest():
    async def announce() -> None:
        loop = asyncio.get_running_loop()
        worker = Worker(DSN, WorkerSettings(), Registry())
        woken = worker.signals.woken.expect()
        baseline = len(_live_timers(loop))
        now = time.time()
        due_times = [now + 60 + i * 0.001 for i in range(100_000)]
        random.shuffle(due_times)
        for due in due_times:
            worker._wake_at(due)
        timers = _live_timers(loop)
        assert len(timers) - baseline == 1
        assert worker._due_timer.due_at == min(due_times)
        worker._wake_at(now - 1)  # due already: a wake-up now, no timer
        assert woken.done() and len(_live_timers(loop)) - baseline == 1
        worker._due_timer.cancel()

    asyncio.run(announce())


@pytest.mark.integration
def test_a_listener_that_starts_listening_has_the_scheduler_look_for_what_it_missed(dsn):
    """A task due in a minute was announced before the listener listened (a worker starting, or
    reconnecting), just after the scheduler's pass had gone to sleep for its longest interval: the
    announcement is lost. Listening pokes the scheduler, whose next pass finds the task."""
    async def start_listening() -> float:
        worker = Worker(dsn, WorkerSettings(scheduler_max_interval_seconds=600), Registry())
        woken = worker.signals.woken.expect()
        assert await worker.scheduler.step() == 600  # nothing waits yet
        with psycopg.connect(dsn, autocommit=True) as conn:  # announced to nobody
            enqueue_many(conn, [{"task": "t", "delay": 60}])
        listening = asyncio.create_task(worker.listener.step())
        try:
            await asyncio.wait_for(worker.scheduler.poked.wait(), 10)
            assert woken.done()
            return await worker.scheduler.step()
        finally:
            listening.cancel()
            for conn in worker._connections():
                await conn.close()

    assert 50 < asyncio.run(start_listening()) <= 60


@pytest.mark.integration
def test_an_idle_worker_makes_at_most_half_a_statement_a_second_and_polls_no_settings_or_schedules(dsn, monkeypatch):
    """An idle worker with default settings, its statements counted over 30 s once started (its claim
    poll then backs off towards 30 s) where all of them go through, DutyConnection.fetch or execute:
    a few heartbeats, rescues and claim polls and a scheduler pass or two (the listener's own LISTENs
    come at start). Its queue has no flow control and there is no schedule, so neither is read again: a
    change to either would notify. Timers only run late on a loaded machine, so the count can only
    be lower there."""
    settle, window = 5.0, 30.0
    statements: list[tuple[float, Statement]] = []

    def counting(run):
        async def counted(self: DutyConnection, statement: Statement, *args: object, **kwargs: object) -> object:
            statements.append((time.monotonic(), statement))
            return await run(self, statement, *args, **kwargs)
        return counted

    monkeypatch.setattr(DutyConnection, "fetch", counting(DutyConnection.fetch))
    monkeypatch.setattr(DutyConnection, "execute", counting(DutyConnection.execute))
    started = time.monotonic()
    assert asyncio.run(run_worker_until(Worker(dsn, WorkerSettings(queues=("idle",)), Registry()),
                                        lambda: time.monotonic() - started > settle + window,
                                        timeout=settle + window + 30)) == 0
    counted_window = [query for at, query in statements if started + settle <= at < started + settle + window]
    polled = [query for query in counted_window
              if query in (flow.LIMITED_QUEUES, cron.DUE_CRON_JOBS, cron.NEXT_CRON_SLOT_IN)]
    assert polled == []
    assert len(counted_window) <= 0.5 * window, counted_window


class SlowRow(NamedTuple):
    slept: str


# Long enough that a notification sent once it runs arrives while it still runs.
SLOW = Statement("test.slow", "SELECT pg_sleep(0.3)::text AS slept", NoParams, SlowRow)
NOTIFY_NOBODY = Statement("test.notify_nobody", "SELECT pg_notify('test_nobody', '')::text AS slept", NoParams,
                          SlowRow)
NOTIFY_ITSELF = Statement("test.notify_itself", "SELECT pg_notify('test_shared', 'itself')::text AS slept",
                          NoParams, SlowRow)


@pytest.mark.integration
def test_the_duty_connection_listens_between_statements_and_loses_no_notification(dsn):
    """The worker listens on its duty connection whenever no statement needs it: a statement gets
    the connection at once from the waiting listener (statements back to back too), and the
    notifications that arrive during it
    (another session's, and its own statement's) are handed to the listener once it waits again,
    as is one that arrives while it waits; the listener is still listening at the end."""
    async def main() -> list[tuple[str, bool]]:
        conn = DutyConnection(dsn, "test-duty")
        heard: list[tuple[str, bool]] = []
        try:
            def hear(notify: psycopg.Notify, idle: bool) -> None:
                heard.append((notify.payload, idle))
            generation = await conn.listen(["test_shared"])
            listening = asyncio.create_task(conn.listen_while_idle(generation, hear))
            await until(lambda: conn.listening, 10, "the listener to wait")
            # Statements one right after the other: each next one asks for the connection the moment
            # the one before hands it to the waiting listener, before the listener runs again.
            for _ in range(3):
                assert await conn.fetch(NOTIFY_NOBODY, NO_PARAMS, timeout=5) == [SlowRow("")]
            slow = asyncio.create_task(conn.fetch(SLOW, NO_PARAMS, timeout=10))
            with psycopg.connect(dsn, autocommit=True) as other:
                await until(lambda: bool(scalar(dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name "
                                                     "= 'test-duty' AND query LIKE '%%pg_sleep%%' AND state = 'active'")),
                            10, "the slow statement to run")
                other.execute("NOTIFY test_shared, 'during'")
                assert await slow == [SlowRow("")]
                await conn.fetch(NOTIFY_ITSELF, NO_PARAMS, timeout=10)
                await until(lambda: len(heard) == 2, 10, "the notifications of the statements' time")
                other.execute("NOTIFY test_shared, 'idle'")
                await until(lambda: len(heard) == 3, 10, "the notification of an idle moment")
            assert not listening.done()
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)
            return heard
        finally:
            await conn.close()
    # Each says whether it was read while the connection was idle, or with a statement's answer
    # (through a pooler, possibly another session's: the listen check counts only the former).
    assert asyncio.run(asyncio.wait_for(main(), 60)) == [("during", False), ("itself", False), ("idle", True)]


@pytest.mark.integration
def test_a_flood_kept_during_a_statement_is_passed_on_whole_in_slices_that_let_the_loop_run(dsn):
    """Notifications that pile up while a statement holds the duty connection (here 1,300, sent by
    another session in one transaction) reach the listener all, in order; they are passed on
    PASS_ON_SLICE at a time, and other coroutines run between the slices: a flood never holds the
    event loop, and so the heartbeat, for as long as it takes to pass on the whole of it."""
    flood = 1_300
    assert flood > 2 * PASS_ON_SLICE  # three slices at least

    async def main() -> tuple[list[str], set[int]]:
        conn = DutyConnection(dsn, "test-duty")
        heard: list[str] = []
        turns = 0  # the ticker's count when each notification was passed on
        seen_at: set[int] = set()

        async def ticker() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        def hear(notify: psycopg.Notify, idle: bool) -> None:
            heard.append(notify.payload)
            seen_at.add(turns)
        ticking = asyncio.create_task(ticker())
        try:
            generation = await conn.listen(["test_flood"])
            slow = asyncio.create_task(conn.fetch(SLOW, NO_PARAMS, timeout=10))
            with psycopg.connect(dsn, autocommit=True) as other:
                await until(lambda: bool(scalar(dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name "
                                                     "= 'test-duty' AND query LIKE '%%pg_sleep%%' AND state = 'active'")),
                            10, "the slow statement to run")
                other.execute("SELECT pg_notify('test_flood', n::text) FROM generate_series(1, %s) AS n", (flood,))
            assert await slow == [SlowRow("")]
            # The server sends what it queued as soon as the statement ends, ahead of the next
            # statement's answer: once that is in, psycopg has read the whole flood.
            assert await conn.fetch(NOTIFY_NOBODY, NO_PARAMS, timeout=10) == [SlowRow("")]
            listening = asyncio.create_task(conn.listen_while_idle(generation, hear))
            await until(lambda: len(heard) == flood, 10, "every notification of the flood")
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)
            return heard, seen_at
        finally:
            ticking.cancel()
            await asyncio.gather(ticking, return_exceptions=True)
            await conn.close()
    heard, seen_at = asyncio.run(asyncio.wait_for(main(), 60))
    assert heard == [str(n) for n in range(1, flood + 1)]
    assert len(seen_at) >= 3, "the loop ran between the slices"
