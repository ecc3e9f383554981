"""Task handlers: registration by decorator, the context a handler receives, and errors.

A handler is a plain function, sync or async, taking the decoded payload and optionally a
TaskContext. What it returns is stored as the task's result. Raising fails the attempt:
retryably by default, permanently with PermanentError.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import importlib
import inspect
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from .. import jsonvalue, metrics, tracing
from ..client.cron import periodic
from ..names import MAX_SECONDS, TaskName

log = logging.getLogger("queueworker.handlers")
_TASK_NAME = TypeAdapter(TaskName)


class PermanentError(Exception):
    """Raise from a handler to fail the task now, without further attempts."""


class UnknownTaskError(PermanentError):
    """No handler is registered for the task's name."""


class DeadlineExceeded(TimeoutError):
    """The attempt ran into its hard deadline and was cancelled."""


def _delay_seconds(seconds: float, what: str) -> float:
    """A delay a handler asked for, checked where it is made: a clear error in the handler's own
    traceback, never a statement the database refuses later."""
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        raise ValueError(f"{what} takes a number of seconds, not {type(seconds).__name__}") from None
    if not 0 <= value <= MAX_SECONDS:  # False for NaN too
        raise ValueError(f"{what} takes 0 to {MAX_SECONDS:,} seconds, not {seconds!r}")
    return value


class Snooze(Exception):  # noqa: N818 - raised as an instruction, not an error
    """Raise from a handler to put the task back to `pending` for `seconds` without consuming an
    attempt: it waits for something outside (a file not there yet, a partner's batch window)."""

    def __init__(self, seconds: float):
        self.seconds = _delay_seconds(seconds, "Snooze")
        super().__init__(f"snoozed for {self.seconds:g} s")


class RetryAfter(Exception):  # noqa: N818
    """Raise from a handler for a retryable failure retried after `seconds` instead of the
    exponential backoff (an HTTP 429 or 503 with a Retry-After header). It consumes an attempt;
    the wait is capped at the worker's --retry-max-seconds."""

    def __init__(self, seconds: float, message: str | None = None):
        self.seconds = _delay_seconds(seconds, "RetryAfter")
        super().__init__(message or f"retry after {self.seconds:g} s")


@dataclass(frozen=True)
class Continue:
    """Return from a handler to succeed and enqueue the next page of the same task with `payload`,
    in the same statement (never one without the other), due after `delay` seconds. The page
    stores `result` as its own result. A page of a run's partition keeps the partition; the run
    counts the partition when its last page ends."""

    payload: Any
    delay: float | None = None
    result: Any = None

    def __post_init__(self) -> None:
        if self.delay is not None:
            object.__setattr__(self, "delay", _delay_seconds(self.delay, "Continue's delay"))


class CancelledByHandler(RuntimeError):
    """The handler raised CancelledError itself (the worker did not cancel it): a retryable
    failure, so the attempt ends at once instead of holding its slot until the deadline."""


@dataclass(frozen=True)
class RunInfo:
    """The partitioned run a task belongs to, as `ctx.run` shows it to the task's handler.

    `partition` is the partition's index, or None for the run's consolidation (`on_success`) and
    alert (`on_failure`). `watermark_before` is the named watermark's value when the run started
    (None the first time): a consolidation exports what changed since then, and the watermark
    moves on only when that consolidation succeeds. `forced` says the run was finalised on purpose
    although some partitions did not succeed.
    """

    id: int
    name: str
    partition: int | None
    watermark: str | None
    watermark_before: Any
    forced: bool

    @classmethod
    def from_json(cls, text: str) -> RunInfo:
        """From the claim's JSON, built by Postgres from the run's row; only the watermark's value
        is user data, so jsonvalue.Undecodable can only come from there."""
        fields = jsonvalue.decode(text)
        return cls(fields["id"], fields["name"], fields["partition"], fields["watermark"],
                   fields["watermark_before"], fields["forced"])


# Bounds of what a handler reports: progress goes with every heartbeat, a checkpoint is read back
# by every later attempt.
PROGRESS_MESSAGE_LIMIT = 500
CHECKPOINT_LIMIT_BYTES = 16 * 1024 * 1024
# A sync handler waits at most this long for its checkpoint write (the statement has its own timeout).
CHECKPOINT_WAIT_SECONDS = 60.0

# (attempt key, checkpoint JSON, progress JSON) -> saved. The worker's, shared by its attempts: a
# per-attempt closure would tie the attempt and its context in a reference cycle, left to the
# garbage collector once per task.
CheckpointSaver = Callable[[tuple[int, int], str, "str | None"], Awaitable[bool]]

# Why a handler is being stopped (`ctx.cancel_reason`).
CANCELLED = "cancelled"    # someone cancelled the task (queueworker.cancel, `queueworker cancel`)
LEASE_LOST = "lease lost"  # the lease expired or moved on (heartbeats failed, the task was rescued)
DEADLINE = "deadline"      # the attempt's hard deadline passed
SHUTDOWN = "shutdown"      # the worker is stopping and its drain time is over


@dataclass
class TaskContext:
    """What a handler knows about the attempt it runs.

    `cancelled` is set when the worker gives up on the attempt (drain timeout, lost lease,
    deadline): long-running sync handlers should check it and return early. Async handlers
    are also cancelled the asyncio way. `run` is set for the tasks of a partitioned run.
    `checkpoint` is what an earlier attempt saved (None at first): resume from there.
    `cancel_reason` says why the worker stopped the attempt (CANCELLED, LEASE_LOST, DEADLINE or
    SHUTDOWN), None while it is not stopped. `key` is the task's key (TaskSpec.key), None without one.
    """

    task_id: int
    task: str
    queue: str
    attempt: int
    max_attempts: int
    logger: logging.Logger
    run: RunInfo | None = None
    checkpoint: Any = None
    key: str | None = None
    cancel_reason: str | None = None
    _cancelled: threading.Event | None = field(default=None, repr=False)
    _progress_json: str | None = field(default=None, repr=False)
    _saver: CheckpointSaver | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _key: tuple[int, int] = field(default=(0, 0), repr=False)

    def stop(self, reason: str) -> None:
        """The worker gives up on the attempt: says why (the first reason stays) and sets
        `cancelled`."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self.cancelled.set()

    def attach(self, saver: CheckpointSaver, loop: asyncio.AbstractEventLoop, key: tuple[int, int]) -> None:
        """The worker's side of save_checkpoint: how to write, on which event loop, for which attempt
        (task id, lease token)."""
        self._saver, self._loop, self._key = saver, loop, key

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Reports how far the attempt got. Written with the worker's next heartbeat (and with a
        checkpoint), so it is cheap to call as often as you like; `status` and `show` display it."""
        for name, value in (("done", done), ("total", total)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise TypeError(f"progress {name} must be a number, not {type(value).__name__}")
        if message is not None:
            message = jsonvalue.safe_text(str(message), limit=PROGRESS_MESSAGE_LIMIT)
        self._progress_json = jsonvalue.encode(  # NotStorable (a ValueError) for NaN or infinity
            {"done": done, "total": total, "message": message, "at": round(time.time(), 3)})

    @property
    def progress_json(self) -> str | None:
        """The last progress reported, as JSON (for the heartbeat)."""
        return self._progress_json

    def save_checkpoint(self, value: Any) -> bool | Awaitable[bool]:
        """Stores `value` (JSON) as the task's checkpoint, given to its next attempt if this one is
        drained, rescued or fails; the write is fenced by the lease. True when stored, False when the
        lease is gone (stop: another attempt owns the task now). In a sync handler it returns the
        bool; in an async handler, await it. A database error is raised to the handler."""
        text = jsonvalue.encode(value, CHECKPOINT_LIMIT_BYTES)  # NotStorable (a ValueError) says why
        if self._saver is None or self._loop is None:
            raise RuntimeError("save_checkpoint works inside a queueworker worker only")
        write = self._write_checkpoint(value, text)
        try:
            in_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            in_loop = False
        if in_loop:
            return write
        return asyncio.run_coroutine_threadsafe(write, self._loop).result(CHECKPOINT_WAIT_SECONDS)

    async def _write_checkpoint(self, value: Any, text: str) -> bool:
        saved = await self._saver(self._key, text, self._progress_json)
        if saved:
            self.checkpoint = value
        return saved

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
        try:
            name = _TASK_NAME.validate_python(name)
        except ValidationError as exc:
            raise ValueError(f"invalid task name {name!r}: {exc.errors()[0]['msg']}") from None
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

    def task(self, fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
        """Registers a handler here: `@registry.task` or `@registry.task(name="emails.send")`."""

        def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
            self.register(f, name)
            return f

        return decorate(fn) if fn is not None else decorate

    def import_modules(self, modules: list[str]) -> None:
        """Imports user handler modules; their @task decorators register into default_registry.

        A module that leads to no handler at all is refused: `--handlers os` or a typo'd package
        that happens to exist would otherwise start a worker that fails every task it claims."""
        for module in modules:
            before = set(self._handlers)
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ImportError(f"cannot import handler module {module!r}: {exc}") from exc
            if set(self._handlers) == before and not self._has_handlers_from(module):
                raise ValueError(f"handler module {module!r} registers no task handlers (no @task in it, "
                                 f"or in what it imports)")

    def _has_handlers_from(self, module: str) -> bool:
        """Handlers defined in `module` or its submodules (registered by an earlier import)."""
        defined_in = (getattr(h.fn, "__module__", None) or "" for h in self._handlers.values())
        return any(name == module or name.startswith(module + ".") for name in defined_in)


default_registry = Registry()


def task(fn: Callable[..., Any] | None = None, *, name: str | None = None, cron: str | None = None,
         timezone: str = "UTC", catch_up: str = "none") -> Any:
    """Registers a handler: `@task` (named after the function) or `@task(name="emails.send")`.
    With `cron`, it also runs periodically: `@task(cron="*/5 * * * *", timezone="Europe/Berlin")`
    declares a schedule of the task's name with an empty payload (queueworker.periodic says more)."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        handler = default_registry.register(f, name)
        if cron is not None:
            periodic(handler.name, cron, handler.name, timezone=timezone, catch_up=catch_up)
        return f

    return decorate(fn) if fn is not None else decorate


# How long a sync handler told to stop may take to return before its thread counts as stuck.
STUCK_GRACE_SECONDS = 2.0


class HandlerThreads:
    """Threads for sync handlers, one per running sync attempt and reused between attempts.

    A thread cannot be stopped: a handler told to give up (deadline, lost lease, drain) that
    ignores `ctx.cancelled` keeps its thread. Such threads are "stuck": counted, logged, exported
    as a metric, and never waited for — the pool starts another thread instead, so the
    attempts that come next start at once and their deadlines run from the moment they start,
    never from a wait for a free thread. Threads are daemons: a stuck one cannot hold up exit.
    """

    def __init__(self, name_prefix: str = "handler"):
        self._name_prefix = name_prefix
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._started = 0
        self._stuck = 0

    @property
    def stuck(self) -> int:
        return self._stuck

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._work.put((future, fn, args))
        with self._lock:
            if self._idle:
                self._idle -= 1  # an idle thread is promised to this item
                return future
            self._started += 1
            number = self._started
        threading.Thread(target=self._serve, name=f"{self._name_prefix}-{number}", daemon=True).start()
        return future

    def abandon(self, future: concurrent.futures.Future, ctx: TaskContext) -> None:
        """The attempt gave up on this handler (called in the event loop's thread). If its thread
        still runs STUCK_GRACE_SECONDS later, the handler ignores `ctx.cancelled`: it is stuck
        until it returns."""
        if not future.done():
            asyncio.get_running_loop().call_later(STUCK_GRACE_SECONDS, self._check_stuck, future, ctx)

    def _check_stuck(self, future: concurrent.futures.Future, ctx: TaskContext) -> None:
        if future.done():
            return
        with self._lock:
            self._stuck += 1
            stuck = self._stuck
        metrics.STUCK_HANDLER_THREADS.set(stuck)
        log.warning("sync handler of task %s (%s) was told to stop %.0f s ago but keeps running; its thread "
                    "is stuck (%d stuck now)", ctx.task_id, ctx.task, STUCK_GRACE_SECONDS, stuck,
                    extra={"task_id": ctx.task_id, "task": ctx.task, "stuck_threads": stuck})
        future.add_done_callback(lambda _: self._unstuck(ctx))

    def _unstuck(self, ctx: TaskContext) -> None:
        with self._lock:
            self._stuck -= 1
            stuck = self._stuck
        metrics.STUCK_HANDLER_THREADS.set(stuck)
        log.info("stuck sync handler of task %s returned (%d stuck now)", ctx.task_id, stuck,
                 extra={"task_id": ctx.task_id, "stuck_threads": stuck})

    def _serve(self) -> None:
        while True:
            future, fn, args = self._work.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting attempt
                    future.set_exception(exc)
            del future, fn, args  # drop references while idle
            with self._lock:
                self._idle += 1


async def run_handler(handler: Handler, payload: Any, ctx: TaskContext, timeout: float,
                      threads: HandlerThreads) -> Any:
    """Runs one attempt with a hard deadline: async handlers inline, sync ones on a thread.
    Raises DeadlineExceeded at the deadline (a TimeoutError the handler raises itself stays an
    ordinary failure), CancelledByHandler when the handler raised CancelledError itself."""
    if timeout <= 0:
        raise DeadlineExceeded("hard deadline already passed before the handler started")
    future: concurrent.futures.Future | None = None
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            if handler.is_async:
                return await handler.invoke(payload, ctx)
            ctx.cancelled  # made here, in the event loop's thread, before the handler's thread looks
            if tracing.TRACER is None:
                future = threads.submit(handler.invoke, payload, ctx)
            else:  # the handler's thread runs in this context: the attempt's span is current there too
                future = threads.submit(contextvars.copy_context().run, handler.invoke, payload, ctx)
            return await asyncio.wrap_future(future)
    except BaseException as exc:
        deadline = isinstance(exc, TimeoutError) and scope.expired()
        if deadline:
            ctx.stop(DEADLINE)  # an async handler's own tasks may be watching it too
        if future is not None and not future.done():
            ctx.cancelled.set()  # the thread cannot be stopped; tell the handler to give up
            threads.abandon(future, ctx)
        if deadline:
            raise DeadlineExceeded("hard deadline exceeded: attempt cancelled") from None
        if isinstance(exc, asyncio.CancelledError):
            _raise_if_cancelled_by_handler()
        raise


def _raise_if_cancelled_by_handler() -> None:
    """Called while a CancelledError propagates: if nobody cancelled this task, the handler
    raised it itself, which is a failure of the attempt, not a cancellation of it."""
    task = asyncio.current_task()
    if task is not None and not task.cancelling():
        raise CancelledByHandler("the handler raised CancelledError itself") from None
