"""Cleaner: deletes finished tasks, and their audit rows, once they are older than the retention.

History does not slow claims (the claim index holds only pending rows), but it costs disk,
vacuum time and backups; the retention keeps it bounded. Every worker runs the cleaner; a
row lock inside the statement (queueworker.duty_locks) makes sure only one at a time does the work."""

from __future__ import annotations

import logging

from .. import metrics
from ..db.connection import DutyConnection
from ..db.duties import CLEAN_FINISHED, CleanFinishedParams

log = logging.getLogger("queueworker.cleaner")

BATCH = 5000


class Cleaner:
    def __init__(self, conn: DutyConnection, retention_seconds: float, interval: float):
        self._conn = conn
        self._retention_seconds = retention_seconds
        self._interval = interval

    async def clean_once(self) -> int:
        """Deletes expired history in batches until none is left; returns how many tasks went."""
        total = 0
        while True:
            rows = await self._conn.fetch(CLEAN_FINISHED, CleanFinishedParams(
                retention_seconds=self._retention_seconds, limit=BATCH))
            total += len(rows)
            if len(rows) < BATCH:
                if total:
                    metrics.TASKS_DELETED.inc(total)
                    log.info("deleted %d finished tasks older than the retention", total)
                return total

    async def step(self) -> float:
        """One pass of the duty; the supervisor spreads the interval by ±20%, so workers rarely
        meet at its lock (a row of queueworker.duty_locks)."""
        await self.clean_once()
        return self._interval
