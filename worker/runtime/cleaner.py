"""Cleaner: keeps every history table bounded. Deletes finished tasks (with their audit rows),
finished runs (with their events) once none of their tasks remain, and queue events, once older
than the retention, and the state of keys idle for as long (their buckets, breakers and health:
one row per key ever seen otherwise); and watermarks not advanced for the watermark retention, a
longer one of their own, since a watermark that goes makes its job's next run start from nothing.

History does not slow claims (the claim index holds only pending rows), but it costs disk,
vacuum time and backups; the retention keeps it bounded. Every worker runs the cleaner; a row lock
inside each statement (one row of queueworker.duty_locks per statement) makes sure only one worker
at a time does each deletion."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from .. import metrics
from ..db.connection import DutyConnection
from ..db.duties import (
    CLEAN_FINISHED, CLEAN_KEY_STATE, CLEAN_QUEUE_EVENTS, CLEAN_RUNS, CLEAN_WATERMARKS, RetentionParams,
)
from ..db.statements import Statement

log = logging.getLogger("queueworker.cleaner")

BATCH = 5000
NAMES_LOGGED = 10  # of the watermarks deleted in a pass, the names the log line shows
NAME_CHARS = 100   # of each name shown


@dataclass(frozen=True)
class Cleaned:
    """What one pass deleted."""

    tasks: int = 0
    runs: int = 0
    queue_events: int = 0
    watermarks: tuple[str, ...] = ()
    key_states: int = 0


class Cleaner:
    """`retention_seconds` bounds tasks, runs, queue events and idle keys' state,
    `watermark_retention_seconds` the watermarks; 0 keeps those rows forever."""

    def __init__(self, conn: DutyConnection, retention_seconds: float, watermark_retention_seconds: float,
                 interval: float):
        self._conn = conn
        self._retention_seconds = retention_seconds
        self._watermark_retention_seconds = watermark_retention_seconds
        self._interval = interval

    async def clean_once(self) -> Cleaned:
        """Deletes expired history in batches until none is left. Tasks go first, so the runs they
        belonged to can go in the same pass; watermarks before runs, so can the run that last
        advanced a deleted watermark."""
        tasks = runs = queue_events = key_states = 0
        watermarks: list[str] = []
        if self._retention_seconds:
            tasks = await self._count(CLEAN_FINISHED, self._retention_seconds)
        if self._watermark_retention_seconds:
            async for rows in self._batches(CLEAN_WATERMARKS, self._watermark_retention_seconds):
                watermarks.extend(row.name for row in rows)
        if self._retention_seconds:
            runs = await self._count(CLEAN_RUNS, self._retention_seconds)
            queue_events = await self._count(CLEAN_QUEUE_EVENTS, self._retention_seconds)
            key_states = await self._count(CLEAN_KEY_STATE, self._retention_seconds)
        cleaned = Cleaned(tasks, runs, queue_events, tuple(watermarks), key_states)
        self._report(cleaned)
        return cleaned

    async def _batches(self, statement: Statement[RetentionParams, Any],
                       retention_seconds: float) -> AsyncIterator[list[Any]]:
        """The rows each batch deleted, until a batch comes back short (none left, or another
        worker holds the statement's lock)."""
        while True:
            rows = await self._conn.fetch(statement, RetentionParams(retention_seconds=retention_seconds,
                                                                     limit=BATCH))
            yield rows
            if len(rows) < BATCH:
                return

    async def _count(self, statement: Statement[RetentionParams, Any], retention_seconds: float) -> int:
        return sum([len(rows) async for rows in self._batches(statement, retention_seconds)])

    @staticmethod
    def _report(cleaned: Cleaned) -> None:
        if cleaned.tasks:
            metrics.TASKS_DELETED.inc(cleaned.tasks)
        for kind, count in (("runs", cleaned.runs), ("queue_events", cleaned.queue_events),
                            ("watermarks", len(cleaned.watermarks)), ("key_states", cleaned.key_states)):
            if count:
                metrics.HISTORY_DELETED.labels(kind).inc(count)
        if cleaned.tasks or cleaned.runs or cleaned.queue_events or cleaned.key_states:
            log.info("deleted %d finished tasks, %d finished runs and %d queue events older than the retention, "
                     "and the state of %d keys idle for as long", cleaned.tasks, cleaned.runs, cleaned.queue_events,
                     cleaned.key_states)
        if cleaned.watermarks:
            shown = ", ".join(repr(name[:NAME_CHARS]) for name in cleaned.watermarks[:NAMES_LOGGED])
            more = len(cleaned.watermarks) - NAMES_LOGGED
            log.info("deleted %d watermarks not advanced within the watermark retention (the next run of each "
                     "starts from nothing): %s%s", len(cleaned.watermarks), shown,
                     f" and {more} more" if more > 0 else "")

    async def step(self) -> float:
        """One pass of the duty; the supervisor spreads the interval by ±20%, so workers rarely
        meet at its locks (rows of queueworker.duty_locks)."""
        await self.clean_once()
        return self._interval
