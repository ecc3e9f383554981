"""Wake-ups cost constant memory: however many tasks are announced as due later, a worker keeps
one timer, for the earliest of them (unit tier). A listener that starts listening looks again for
what it may have missed (integration tier)."""

from __future__ import annotations

import asyncio
import random
import time

import psycopg
import pytest

from queueworker import enqueue_many
from queueworker.handlers import Registry
from queueworker.settings import WorkerSettings
from queueworker.worker import Worker

DSN = "postgresql://app@127.0.0.1:1/app"  # never connected to


def _live_timers(loop: asyncio.AbstractEventLoop) -> list[asyncio.TimerHandle]:
    return [handle for handle in loop._scheduled if not handle.cancelled()]  # type: ignore[attr-defined]


def test_many_future_due_times_keep_one_timer_for_the_earliest():
    async def announce() -> None:
        loop = asyncio.get_running_loop()
        worker = Worker(DSN, WorkerSettings(), Registry())
        worker._wakeup = asyncio.Event()
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
        assert worker._wakeup.is_set() and len(_live_timers(loop)) - baseline == 1
        worker._due_timer.cancel()

    asyncio.run(announce())


@pytest.mark.integration
def test_a_listener_that_starts_listening_has_the_scheduler_look_for_what_it_missed(dsn):
    """A task due in a minute was announced before the listener listened (a worker starting, or
    reconnecting), just after the scheduler's pass had gone to sleep for its longest interval: the
    announcement is lost. Listening pokes the scheduler, whose next pass finds the task."""
    async def start_listening() -> float:
        worker = Worker(dsn, WorkerSettings(scheduler_max_interval_seconds=600), Registry())
        worker._wakeup = asyncio.Event()
        assert await worker.scheduler.step() == 600  # nothing waits yet
        with psycopg.connect(dsn, autocommit=True) as conn:  # announced to nobody
            enqueue_many(conn, [{"task": "t", "delay": 60}])
        listening = asyncio.create_task(worker.listener.step())
        try:
            await asyncio.wait_for(worker.scheduler.poked.wait(), 10)
            assert worker._wakeup.is_set()
            return await worker.scheduler.step()
        finally:
            listening.cancel()
            await worker._duty_conn.close()

    assert 50 < asyncio.run(start_listening()) <= 60
