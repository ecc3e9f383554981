"""Cancellations of running attempts, confirmed by the database before a handler is stopped.

A notification on queueworker_cancel (`worker-id task-id lease-token`) is a hint, never an order:
any login may LISTEN and NOTIFY, and a worker's id and its lease tokens show in the notifications
it overhears. So the listener only hands the attempt a notice names to `hint`, which keeps it if
this worker runs that attempt (nothing else costs a statement), and the cancel duty asks the
database (lease.cancelled_leases) whether that task, with that lease token, really was cancelled
before it stops the handler. Notices that arrive while a look is under way are answered together
by the next one: a flood costs at most one statement per notice naming an attempt this worker
runs, usually far fewer, and never a statement while a failing look waits out its ErrorWait. A
worker that cannot listen asks the same about every running attempt once per poll, and a worker
whose listener (re)starts listening once then (`catch_up`): notices sent before are lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .. import metrics
from ..db.connection import DutyConnection
from ..db.lease import CANCELLED_LEASES, CancelledLeasesParams

log = logging.getLogger("queueworker.cancels")

Key = tuple[int, int]  # (task id, lease token): an attempt


class CancelChecks:
    def __init__(self, conn: DutyConnection, runs: Callable[[Key], bool], running: Callable[[], list[Key]],
                 stop: Callable[[Key], None]):
        self._conn = conn
        self._runs = runs  # whether the handler of this attempt runs now
        self._running = running  # the attempts whose handlers run now (not reporting, not abandoned)
        self._stop = stop  # stops the handler of an attempt whose task the database shows cancelled
        self._hinted: set[Key] = set()
        self._look_at_all = False  # the listener (re)started: notices sent before may be lost
        self.wake = asyncio.Event()  # the cancel duty's: attempts were named

    def hint(self, task_id: int, token: int) -> bool:
        """A notification named this attempt: have the cancel duty look it up (once, however often
        it is named before the look) if its handler runs here; whether it does."""
        key = (task_id, token)
        if not self._runs(key):
            return False
        self._hinted.add(key)
        self.wake.set()
        return True

    def catch_up(self) -> None:
        """The listener (re)started listening: a cancellation notice sent before it listened (a task
        claimed while the worker started, or while the listener reconnected) never comes, so the
        next pass looks at every running attempt once, as a poll does."""
        self._look_at_all = True
        self.wake.set()

    async def step(self) -> None:
        """The cancel duty's pass: one look at every attempt named since the last (at every running
        one after `catch_up`). Kept for the next pass should the look fail."""
        hinted, self._hinted = self._hinted, set()
        look_at_all, self._look_at_all = self._look_at_all, False
        try:
            if look_at_all:
                await self._poll()
            await self._check([key for key in hinted if self._runs(key)], "notified")
        except BaseException:
            self._hinted |= hinted
            self._look_at_all |= look_at_all
            raise

    async def _poll(self) -> None:
        """One look at every running attempt."""
        await self._check(self._running(), "polled")

    async def _check(self, keys: list[Key], reason: str) -> None:
        if not keys:
            return
        metrics.CANCEL_CHECKS.labels(reason).inc()
        rows = await self._conn.fetch(CANCELLED_LEASES, CancelledLeasesParams(
            ids=[task_id for task_id, _ in keys], tokens=[token for _, token in keys]))
        cancelled = {(row.id, row.lease_token) for row in rows}
        for key in keys:
            if key in cancelled:
                self._stop(key)
        if reason == "notified" and len(cancelled) < len(keys):
            metrics.CANCELS_UNCONFIRMED.inc(len(keys) - len(cancelled))
            log.debug("%d attempts named by cancellation notices are not cancelled in the database: "
                      "their handlers go on", len(keys) - len(cancelled))
