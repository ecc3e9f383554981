"""Unit: handler registry, settings validation, built-in tasks."""

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import pytest
from pydantic import ValidationError

from queueworker.builtin_tasks import register_builtin_tasks
from queueworker.handlers import PermanentError, Registry, TaskContext, UnknownTaskError, run_handler
from queueworker.settings import WorkerSettings


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
    ctx = _ctx()

    async def run():
        with pytest.raises(TimeoutError):
            await run_handler(handler, {}, ctx, 0.1, executor)

    with ThreadPoolExecutor(1) as executor:
        asyncio.run(run())
    assert seen == [True]


def test_async_handler_gets_cancelled_at_its_deadline():
    registry = Registry()
    register_builtin_tasks(registry)

    async def run():
        with pytest.raises(TimeoutError):
            await run_handler(registry.get("qw.sleep"), {"seconds": 5}, _ctx(), 0.05, None)

    asyncio.run(run())


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
