"""Signals: moments in a running worker's life that tests, and applications that embed a worker,
can watch, and where a test can make the worker fail on purpose (docs/embedding.md).

Each `Signal` is off until something watches it: emitting one that nobody watches looks at an
empty tuple and returns, so a worker pays nothing for its signals in production. A watcher is
called inline, on the worker's loop, at the moment the event happens and before the worker goes
on, so what it reads of the worker is what the event left. It must be quick. An exception it
raises is raised where the event happened, as if the worker's own code had failed there: that is
how a test injects a failure into a claim, a completion or the handling of a notification, and
sees the worker survive it as it would a real one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

import psycopg

from ..db.lease import ClaimedRow

T = TypeVar("T")


class Signal(Generic[T]):
    """One kind of event, with the value it carries."""

    __slots__ = ("_watchers",)

    def __init__(self) -> None:
        self._watchers: tuple[Callable[[T], Any], ...] = ()

    def watch(self, watcher: Callable[[T], Any]) -> Callable[[], None]:
        """Calls `watcher(value)` at every event from now on; returns what stops it."""
        self._watchers += (watcher,)

        def stop() -> None:
            self._watchers = tuple(w for w in self._watchers if w is not watcher)
        return stop

    def expect(self, accept: Callable[[T], bool] = lambda value: True) -> asyncio.Future[T]:
        """A future of the next event's value (the next that `accept` accepts), watched from now on:
        made before whatever should cause the event, awaited after (with a timeout of one's own)."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        def take(value: T) -> None:
            if not future.done() and accept(value):
                future.set_result(value)
        stop = self.watch(take)
        future.add_done_callback(lambda _: stop())
        return future

    def emit(self, value: T) -> None:
        for watcher in self._watchers:
            watcher(value)


class DutyPass(NamedTuple):
    """A background duty's pass ended: the duty's name (as its log lines say it), the seconds it
    asked to wait before the next one (None: until woken), or that it failed."""

    duty: str
    delay: float | None
    failed: bool = False


class WorkerSignals:
    """The signals of one worker (`Worker.signals`)."""

    def __init__(self) -> None:
        self.duty_started: Signal[str] = Signal()
        """A background duty's pass begins: its name."""
        self.duty_ended: Signal[DutyPass] = Signal()
        """A background duty's pass ended, or failed."""
        self.listening: Signal[None] = Signal()
        """The listener listens (LISTEN in place on every channel), and has had the worker look
        again at whatever notifications it may have missed: from now on it hears every change."""
        self.heard: Signal[psycopg.Notify] = Signal()
        """A notification reached the listener, before the listener acts on it."""
        self.woken: Signal[None] = Signal()
        """The fetch loop was woken to claim now: tasks announced as due, the listener's catch-up, a
        change of flow control."""
        self.claiming: Signal[str] = Signal()
        """A claim is about to be sent, for this queue."""
        self.claimed: Signal[list[ClaimedRow]] = Signal()
        """A claim returned these rows (maybe none); their attempts have started."""
        self.completing: Signal[int] = Signal()
        """A completion statement is about to be sent, for this many outcomes."""
