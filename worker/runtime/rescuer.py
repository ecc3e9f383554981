"""Rescuer: returns tasks whose lease expired to the queue (or fails them when their attempts
are spent) and forgets workers that stopped heartbeating. Every worker runs it; a row
lock inside the statement (queueworker.duty_locks) makes sure only one at a time does the work."""

from __future__ import annotations

import logging

from .. import metrics
from ..db.connection import DutyConnection
from ..db.duties import RESCUE, RescueParams

log = logging.getLogger("queueworker.rescuer")

BATCH = 1000


class Rescuer:
    def __init__(self, conn: DutyConnection, interval: float, deadline_grace: float, worker_ttl: float):
        self._conn = conn
        self._interval = interval
        self._deadline_grace = deadline_grace
        self._worker_ttl = worker_ttl

    async def rescue_once(self) -> tuple[int, int]:
        """One pass; returns (requeued, failed). Repeats while full batches come back."""
        total_requeued = total_failed = 0
        while True:
            rescued = (await self._conn.fetch(RESCUE, RescueParams(
                deadline_grace=self._deadline_grace, worker_ttl=self._worker_ttl,
                limit=BATCH)))[0]
            if rescued.requeued or rescued.failed or rescued.reaped:
                metrics.LEASES_RECOVERED.labels("requeued").inc(rescued.requeued)
                metrics.LEASES_RECOVERED.labels("failed").inc(rescued.failed)
                log.warning("rescued expired leases: %d back to pending, %d failed (attempts spent); "
                            "forgot %d dead workers", rescued.requeued, rescued.failed, rescued.reaped)
            total_requeued += rescued.requeued
            total_failed += rescued.failed
            if not rescued.held or rescued.requeued + rescued.failed < BATCH:
                return total_requeued, total_failed

    async def step(self) -> float:
        """One pass of the duty; the supervisor spreads the interval by ±20%, so workers rarely
        meet at its lock (a row of queueworker.duty_locks)."""
        await self.rescue_once()
        return self._interval
