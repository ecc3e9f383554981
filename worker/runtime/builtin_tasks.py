"""Tasks available with no handler module, for demos, smoke tests and benchmarks.

Their payloads are checked before anything runs: a payload that can never work (a string for a
number, a negative or absurd duration, an unknown field) fails the task permanently at its first
attempt instead of spending every retry on the same mistake.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .handlers import PermanentError, Registry, TaskContext

MAX_SLEEP_SECONDS = 24 * 3600.0

_Payload = TypeVar("_Payload", bound=BaseModel)


class SleepPayload(BaseModel):
    """`qw.sleep`: `{"seconds": x}`, a finite number from 0 to a day (default 1)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    seconds: float = Field(default=1.0, ge=0, le=MAX_SLEEP_SECONDS)


class FailPayload(BaseModel):
    """`qw.fail`: `{"retryable": true|false, "message": "..."}`, both optional."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    retryable: bool = True
    message: str = Field(default="qw.fail failed on purpose", min_length=1, max_length=10_000)


def _parse(model: type[_Payload], task: str, payload: Any) -> _Payload:
    """The payload as `model`, or PermanentError saying what is wrong with it."""
    try:
        return model.model_validate({} if payload is None else payload)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'payload'}: {e['msg']}" for e in exc.errors())
        raise PermanentError(f"{task} payload is invalid: {problems}") from None


async def noop(payload: Any) -> None:
    return None


async def sleep(payload: Any, ctx: TaskContext) -> dict:
    seconds = _parse(SleepPayload, "qw.sleep", payload).seconds
    await asyncio.sleep(seconds)
    return {"slept": seconds, "attempt": ctx.attempt}


async def fail(payload: Any) -> None:
    options = _parse(FailPayload, "qw.fail", payload)
    if options.retryable:
        raise RuntimeError(options.message)
    raise PermanentError(options.message)


def register_builtin_tasks(registry: Registry) -> None:
    registry.register(noop, "qw.noop")
    registry.register(sleep, "qw.sleep")
    registry.register(fail, "qw.fail")
