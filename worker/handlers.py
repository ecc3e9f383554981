"""Task handlers: registration by decorator, the context a handler receives, and errors.

A handler is a plain function, sync or async, taking the decoded payload and optionally a
TaskContext. What it returns is stored as the task's result. Raising fails the attempt:
retryably by default, permanently with PermanentError.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class PermanentError(Exception):
    """Raise from a handler to fail the task now, without further attempts."""


class UnknownTaskError(PermanentError):
    """No handler is registered for the task's name."""


@dataclass
class TaskContext:
    """What a handler knows about the attempt it runs.

    `cancelled` is set when the worker gives up on the attempt (drain timeout, lost lease,
    deadline): long-running sync handlers should check it and return early. Async handlers
    are also cancelled the asyncio way.
    """

    task_id: int
    task: str
    queue: str
    attempt: int
    max_attempts: int
    logger: logging.Logger
    _cancelled: threading.Event | None = field(default=None, repr=False)

    @property
    def cancelled(self) -> threading.Event:
        """Made on first use: most attempts never need one, and an Event costs a Condition and a
        Lock per task. run_handler makes it, in the event loop's thread, before a sync handler's
        thread can look at it."""
        if self._cancelled is None:
            self._cancelled = threading.Event()
        return self._cancelled

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts


@dataclass(frozen=True)
class Handler:
    name: str
    fn: Callable[..., Any]
    is_async: bool
    wants_context: bool

    def invoke(self, payload: Any, ctx: TaskContext) -> Any:
        return self.fn(payload, ctx) if self.wants_context else self.fn(payload)


class Registry:
    """Task name -> handler. The worker looks names up here; unknown names fail permanently."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, fn: Callable[..., Any], name: str | None = None) -> Handler:
        name = name or fn.__name__
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not 1 <= len(params) <= 2:
            raise TypeError(f"handler {name!r} must take (payload) or (payload, ctx)")
        existing = self._handlers.get(name)
        if existing is not None and existing.fn is not fn:
            raise ValueError(f"task name {name!r} is already registered to {existing.fn!r}")
        handler = Handler(name, fn, inspect.iscoroutinefunction(fn), len(params) == 2)
        self._handlers[name] = handler
        return handler

    def get(self, name: str) -> Handler:
        try:
            return self._handlers[name]
        except KeyError:
            known = ", ".join(sorted(self._handlers)) or "none"
            raise UnknownTaskError(f"no handler registered for task {name!r} (known: {known})") from None

    def __contains__(self, name: str) -> bool:
        return name in self._handlers

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def import_modules(self, modules: list[str]) -> None:
        """Imports user handler modules; their @task decorators register into default_registry."""
        for module in modules:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ImportError(f"cannot import handler module {module!r}: {exc}") from exc


default_registry = Registry()


def task(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Registers a handler: `@task` (named after the function) or `@task(name="emails.send")`."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        default_registry.register(f, name)
        return f

    return decorate(fn) if fn is not None else decorate


async def run_handler(handler: Handler, payload: Any, ctx: TaskContext, timeout: float,
                      executor: Any) -> Any:
    """Runs one attempt with a hard deadline: async handlers inline, sync ones on a thread."""
    if timeout <= 0:
        raise TimeoutError("hard deadline already passed before the handler started")
    if handler.is_async:
        async with asyncio.timeout(timeout):
            return await handler.invoke(payload, ctx)
    loop = asyncio.get_running_loop()
    cancelled = ctx.cancelled
    future = loop.run_in_executor(executor, handler.invoke, payload, ctx)
    try:
        async with asyncio.timeout(timeout):
            return await future
    except BaseException:
        cancelled.set()  # the thread cannot be stopped; tell the handler to give up
        raise
