"""Rescuer: returns tasks whose lease expired to the queue (or fails them when their attempts
are spent) and forgets workers that stopped heartbeating. Every worker runs it; an advisory
lock inside the statement makes sure only one at a time does the work."""

from __future__ import annotations

import logging

from .. import metrics
from ..db import sql
from ..db.connection import DutyConnection

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
            (held, requeued, failed, reaped, _), = await self._conn.fetch(sql.RESCUE, {
                "lock_key": sql.RESCUER_LOCK_KEY, "deadline_grace": self._deadline_grace,
                "worker_ttl": self._worker_ttl, "limit": BATCH})
            if requeued or failed or reaped:
                metrics.LEASES_RECOVERED.labels("requeued").inc(requeued)
                metrics.LEASES_RECOVERED.labels("failed").inc(failed)
                log.warning("rescued expired leases: %d back to pending, %d failed (attempts spent); "
                            "forgot %d dead workers", requeued, failed, reaped)
            total_requeued += requeued
            total_failed += failed
            if not held or requeued + failed < BATCH:
                return total_requeued, total_failed

    async def step(self) -> float:
        """One pass of the duty; the supervisor spreads the interval by ±20%, so workers rarely
        meet at its advisory lock."""
        await self.rescue_once()
        return self._interval
