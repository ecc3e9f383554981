"""Waiting: on an asyncio.Event with a timeout, and until the earliest of many announced due times;
and reading what a producer announces.

asyncio.wait_for() on Python 3.11 can swallow a cancellation that races with the event being
set, which left duties running after shutdown cancelled them; asyncio.timeout() does not.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """True if the event was set within `timeout` seconds (None: wait forever)."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
        return True
    except TimeoutError:
        return False


def parse_announcement(payload: str) -> tuple[str, float] | None:
    """A producer's notification on `db.notify.NOTIFY_CHANNEL`: `queue` (tasks due now: 0.0) or
    `queue <epoch>` (a batch due then). None for anything else: queueworker never announces a
    time that is not a finite number."""
    queue, _, due = payload.partition(" ")
    try:
        due_epoch = float(due) if due else 0.0
    except ValueError:
        return None
    return (queue, due_epoch) if math.isfinite(due_epoch) else None


class DueTimer:
    """One timer for the earliest of many due times (epoch seconds). Whatever it wakes finds the
    later ones too, so they need no timer of their own: however many are announced, one is kept."""

    def __init__(self, on_due: Callable[[], None]):
        self._on_due = on_due
        self._handle: asyncio.TimerHandle | None = None
        self.due_at = math.inf

    def at(self, due_epoch: float) -> None:
        """Calls `on_due` at `due_epoch`, unless a call at or before it is already set."""
        if self._handle is not None and self.due_at <= due_epoch:
            return
        self.cancel()
        self.due_at = due_epoch
        self._handle = asyncio.get_running_loop().call_later(max(0.0, due_epoch - time.time()), self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle, self.due_at = None, math.inf

    def _fire(self) -> None:
        self._handle, self.due_at = None, math.inf
        self._on_due()
