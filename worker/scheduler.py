"""Scheduler: admits waiting tasks to the claim index when their time comes — `retrying` tasks
whose backoff is over become `pending`, delayed `pending` tasks become claimable — and wakes
their queues.

It sleeps exactly until the next one is due (bounded by a maximum), so retries and delayed tasks
start on time without polling, and rows waiting for a time never slow down claims."""

from __future__ import annotations

import asyncio
import logging

import psycopg

from . import metrics, sql
from .backoff import error_wait
from .db import DutyConnection
from .events import wait_event

log = logging.getLogger("queueworker.scheduler")

BATCH = 5000
MIN_SLEEP = 0.01


class Scheduler:
    def __init__(self, conn: DutyConnection, max_interval: float):
        self._conn = conn
        self._max_interval = max_interval
        self._poke = asyncio.Event()

    def poke(self) -> None:
        """Something became due or started waiting: run a pass now and recompute the next due time."""
        self._poke.set()

    async def promote_once(self) -> float | None:
        """Promotes due tasks; returns seconds until the next one is due (None: none waiting)."""
        while True:
            (promoted, _, next_due_in), = await self._conn.fetch(sql.PROMOTE_DUE, {
                "lock_key": sql.SCHEDULER_LOCK_KEY, "limit": BATCH})
            if promoted:
                metrics.TASKS_PROMOTED.inc(promoted)
                log.debug("admitted %d due tasks to the claim index", promoted)
            if promoted < BATCH:
                return next_due_in

    async def run(self) -> None:
        failures = 0
        sleep = 0.0
        while True:
            await wait_event(self._poke, sleep)
            self._poke.clear()
            try:
                next_due_in = await self.promote_once()
                failures = 0
            except psycopg.Error as exc:
                failures += 1
                metrics.DB_ERRORS.labels("schedule").inc()
                log.warning("scheduler pass failed: %s", exc)
                sleep = error_wait(failures)
                continue
            sleep = self._max_interval if next_due_in is None else min(self._max_interval,
                                                                         max(MIN_SLEEP, next_due_in))
