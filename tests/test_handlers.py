"""Unit: handler registry, settings validation, built-in tasks."""

import asyncio
import logging
import threading
import time

import pytest
from pydantic import ValidationError

from queueworker import metrics
from queueworker.runtime.builtin_tasks import register_builtin_tasks
from queueworker.runtime.handlers import (STUCK_GRACE_SECONDS, CancelledByHandler, DeadlineExceeded, HandlerThreads,
                                  PermanentError, Registry, TaskContext, UnknownTaskError, run_handler)
from queueworker.settings import WorkerSettings
from tests.support import wait_until


def _ctx() -> TaskContext:
    return TaskContext(1, "t", "default", 1, 3, logging.getLogger("test"))


def test_registry_takes_payload_or_payload_and_context():
    registry = Registry()

    def one(payload):
        return payload

    async def two(payload, ctx):
        return ctx.attempt

    assert not registry.register(one).wants_context
    handler = registry.register(two, "custom.name")
    assert handler.is_async and handler.wants_context and "custom.name" in registry
    with pytest.raises(TypeError):
        registry.register(lambda: None, "bad")


def test_registry_refuses_a_second_function_under_the_same_name():
    registry = Registry()
    registry.register(lambda p: 1, "x")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(lambda p: 2, "x")


def test_unknown_task_is_a_permanent_error_naming_the_known_ones():
    registry = Registry()
    register_builtin_tasks(registry)
    with pytest.raises(UnknownTaskError, match="known: qw.fail, qw.noop, qw.sleep") as info:
        registry.get("nope")
    assert isinstance(info.value, PermanentError)


def test_sync_handler_past_its_deadline_is_told_to_stop():
    seen = []

    def slow(payload, ctx):
        seen.append(ctx.cancelled.wait(5))

    registry = Registry()
    handler = registry.register(slow)

    async def run():
        with pytest.raises(DeadlineExceeded):
            await run_handler(handler, {}, _ctx(), 0.1, HandlerThreads())

    asyncio.run(run())
    # The handler's thread is a daemon nobody joins: give it its moment.
    wait_until(lambda: seen, timeout=5, interval=0.01, message="the handler to see its cancellation")
    assert seen == [True]


def test_async_handler_gets_cancelled_at_its_deadline():
    registry = Registry()
    register_builtin_tasks(registry)

    async def run():
        with pytest.raises(DeadlineExceeded):
            await run_handler(registry.get("qw.sleep"), {"seconds": 5}, _ctx(), 0.05, HandlerThreads())

    asyncio.run(run())


def test_a_timeout_the_handler_raises_itself_is_not_the_deadline():
    registry = Registry()

    async def calls_a_slow_service(payload):
        raise TimeoutError("upstream took too long")

    async def run():
        with pytest.raises(TimeoutError) as caught:
            await run_handler(registry.register(calls_a_slow_service), {}, _ctx(), 5, HandlerThreads())
        assert not isinstance(caught.value, DeadlineExceeded)

    asyncio.run(run())


@pytest.mark.parametrize("is_async", [True, False])
def test_a_handler_raising_cancelled_error_itself_fails_retryably(is_async):
    registry = Registry()

    async def async_quitter(payload):
        raise asyncio.CancelledError()

    def sync_quitter(payload):
        raise asyncio.CancelledError()

    handler = registry.register(async_quitter if is_async else sync_quitter)

    async def run():
        with pytest.raises(CancelledByHandler):
            await run_handler(handler, {}, _ctx(), 5, HandlerThreads())

    asyncio.run(run())


def test_a_cancelled_attempt_still_propagates_cancellation():
    registry = Registry()
    register_builtin_tasks(registry)

    async def run():
        runner = asyncio.create_task(run_handler(registry.get("qw.sleep"), {"seconds": 5}, _ctx(), 5,
                                                 HandlerThreads()))
        await asyncio.sleep(0.05)
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner

    asyncio.run(run())


def test_stuck_sync_threads_are_counted_and_never_delay_the_next_attempts():
    """Handlers that ignore cancellation keep their threads; the attempts after them still start at
    once and get their whole deadline (no waiting for a free thread). A thread counts as stuck only
    when its handler is still running a grace period after being told to stop."""
    release = threading.Event()
    registry = Registry()

    def stubborn(payload, ctx):
        release.wait(10)  # ignores ctx.cancelled

    def quick(payload, ctx):
        time.sleep(0.2)
        return "done"

    def obedient(payload, ctx):
        ctx.cancelled.wait(10)  # returns as soon as it is told to stop

    threads = HandlerThreads()
    stuck_handler, quick_handler = registry.register(stubborn), registry.register(quick)
    obedient_handler = registry.register(obedient)

    async def run():
        stuck = [run_handler(stuck_handler, {}, _ctx(), 0.1, threads) for _ in range(4)]
        stopped = [run_handler(obedient_handler, {}, _ctx(), 0.1, threads) for _ in range(2)]
        outcomes = await asyncio.gather(*stuck, *stopped, return_exceptions=True)
        assert all(isinstance(o, DeadlineExceeded) for o in outcomes)
        # Each quick attempt needs 0.2 s of its 0.5 s deadline: none may wait behind the stuck ones.
        assert await asyncio.gather(*(run_handler(quick_handler, {}, _ctx(), 0.5, threads)
                                      for _ in range(4))) == ["done"] * 4
        await asyncio.sleep(STUCK_GRACE_SECONDS + 0.2)
        assert threads.stuck == 4 and metrics.STUCK_HANDLER_THREADS._value.get() == 4

    asyncio.run(run())
    release.set()
    wait_until(lambda: threads.stuck == 0, timeout=5, interval=0.01, message="the released threads to end")
    assert threads.stuck == 0


@pytest.mark.parametrize("options, message", [
    ({"lease_seconds": 4, "heartbeat_seconds": 3}, "at most half the lease"),
    ({"queues": ("bad queue",)}, "should match pattern"),
    ({"concurrency": 0}, "greater than or equal to 1"),
    ({"unknown": 1}, "Extra inputs are not permitted"),
])
def test_settings_reject_incoherent_values(options, message):
    with pytest.raises(ValidationError, match=message):
        WorkerSettings(**options)


def test_rescue_interval_and_worker_ttl_follow_the_lease():
    settings = WorkerSettings(lease_seconds=8, heartbeat_seconds=2)
    assert settings.rescue_interval_seconds == 2 and settings.worker_ttl_seconds == 32
