"""Tasks available with no handler module, for demos, smoke tests and benchmarks."""

from __future__ import annotations

import asyncio
from typing import Any

from .handlers import PermanentError, Registry, TaskContext


async def noop(payload: Any) -> None:
    return None


async def sleep(payload: dict, ctx: TaskContext) -> dict:
    seconds = float((payload or {}).get("seconds", 1.0))
    if seconds < 0:
        raise PermanentError("qw.sleep needs seconds >= 0")
    await asyncio.sleep(seconds)
    return {"slept": seconds, "attempt": ctx.attempt}


async def fail(payload: dict) -> None:
    payload = payload or {}
    message = str(payload.get("message", "qw.fail failed on purpose"))
    if payload.get("retryable", True):
        raise RuntimeError(message)
    raise PermanentError(message)


def register_builtin_tasks(registry: Registry) -> None:
    registry.register(noop, "qw.noop")
    registry.register(sleep, "qw.sleep")
    registry.register(fail, "qw.fail")
