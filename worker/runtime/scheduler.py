"""Scheduler: admits waiting tasks to the claim index when their time comes — `retrying` tasks
whose backoff is over become `pending`, delayed `pending` tasks become claimable — and wakes
their queues.

It sleeps exactly until the next one is due (bounded by a maximum), so retries and delayed tasks
start on time without polling, and rows waiting for a time never slow down claims."""

from __future__ import annotations

import asyncio
import logging

from .. import metrics
from ..db.connection import DutyConnection
from ..db.duties import PROMOTE_DUE, PromoteDueParams

log = logging.getLogger("queueworker.scheduler")

BATCH = 5000
MIN_SLEEP = 0.01


class Scheduler:
    def __init__(self, conn: DutyConnection, max_interval: float):
        self._conn = conn
        self._max_interval = max_interval
        self.poked = asyncio.Event()

    def poke(self) -> None:
        """Something became due or started waiting: run a pass now and recompute the next due time."""
        self.poked.set()

    async def promote_once(self) -> float | None:
        """Promotes due tasks; returns seconds until the next one is due (None: none waiting)."""
        while True:
            due = (await self._conn.fetch(PROMOTE_DUE, PromoteDueParams(limit=BATCH)))[0]
            if due.promoted:
                metrics.TASKS_PROMOTED.inc(due.promoted)
                log.debug("admitted %d due tasks to the claim index", due.promoted)
            if due.promoted < BATCH:
                return due.next_due_in

    async def step(self) -> float:
        """One pass of the scheduler duty; returns how long to sleep (until the next task is due)."""
        next_due_in = await self.promote_once()
        return self._max_interval if next_due_in is None else min(self._max_interval, max(MIN_SLEEP, next_due_in))
