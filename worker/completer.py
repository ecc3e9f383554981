"""Batched, fenced completion: outcomes are buffered and flushed in one statement per kind.

Outcomes survive database errors in the buffer and are retried; rows whose
lease moved on are reported by the database as not updated, counted as stale and dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from . import metrics, sql
from .attempt import Attempt
from .backoff import error_wait
from .db import DutyConnection

log = logging.getLogger("queueworker.completer")


class Completer:
    def __init__(self, conn: DutyConnection, flush_interval: float, max_batch: int,
                 on_flushed: Callable[[list[Attempt]], None], on_retrying: Callable[[], None]):
        self._conn = conn
        self._on_retrying = on_retrying  # tasks entered `retrying`: the scheduler must know when they are due
        self._flush_interval = flush_interval
        self._max_batch = max_batch
        self._on_flushed = on_flushed
        self._succeeded: list[tuple[Attempt, str | None]] = []
        self._failed: list[tuple[Attempt, bool, float, dict[str, Any]]] = []
        self._pending = asyncio.Event()
        self._failures = 0

    def succeed(self, attempt: Attempt, result_json: str | None) -> None:
        attempt.reporting = True
        self._succeeded.append((attempt, result_json))
        self._pending.set()

    def fail(self, attempt: Attempt, retryable: bool, backoff_seconds: float, error: dict[str, Any]) -> None:
        attempt.reporting = True
        self._failed.append((attempt, retryable, backoff_seconds, error))
        self._pending.set()

    @property
    def buffered(self) -> int:
        return len(self._succeeded) + len(self._failed)

    async def run(self) -> None:
        """Flush loop: wait for outcomes, let a batch gather briefly, flush, repeat."""
        while True:
            await self._pending.wait()
            if self.buffered < self._max_batch and self._flush_interval:
                await asyncio.sleep(self._flush_interval)
            try:
                await self.flush()
                self._failures = 0
            except psycopg.Error as exc:
                self._failures += 1
                metrics.DB_ERRORS.labels("complete").inc()
                log.warning("completion flush failed, will retry: %s", exc)
                await asyncio.sleep(error_wait(self._failures))

    async def flush(self) -> None:
        """Writes every buffered outcome. On error the outcomes stay buffered."""
        self._pending.clear()
        succeeded, self._succeeded = self._succeeded[: self._max_batch], self._succeeded[self._max_batch:]
        failed, self._failed = self._failed[: self._max_batch], self._failed[self._max_batch:]
        try:
            done = await self._flush_succeeded(succeeded) + await self._flush_failed(failed)
        except BaseException:
            self._succeeded[:0] = succeeded
            self._failed[:0] = failed
            self._pending.set()
            raise
        finally:
            if self._succeeded or self._failed:
                self._pending.set()
        self._on_flushed(done)

    async def _flush_succeeded(self, batch: list[tuple[Attempt, str | None]]) -> list[Attempt]:
        if not batch:
            return []
        rows = await self._conn.fetch(sql.COMPLETE_SUCCEEDED, {
            "ids": [a.id for a, _ in batch], "tokens": [a.token for a, _ in batch],
            "results": [r for _, r in batch]})
        updated = {row[0] for row in rows}
        succeeded_per_queue = Counter(attempt.queue for attempt, _ in batch if attempt.id in updated)
        for queue, count in succeeded_per_queue.items():
            metrics.TASKS_COMPLETED.labels(queue, "succeeded").inc(count)
        for attempt, _ in batch:
            if attempt.id not in updated:
                _stale(attempt, "succeeded")
        return [a for a, _ in batch]

    async def _flush_failed(self, batch: list[tuple[Attempt, bool, float, dict[str, Any]]]) -> list[Attempt]:
        if not batch:
            return []
        rows = await self._conn.fetch(sql.COMPLETE_FAILED, {
            "ids": [b[0].id for b in batch], "tokens": [b[0].token for b in batch],
            "retryables": [b[1] for b in batch], "backoffs": [b[2] for b in batch],
            "errors": [Jsonb(b[3]) for b in batch]})
        outcome = dict(rows)
        if "retrying" in outcome.values():
            self._on_retrying()
        for attempt, _, _, error in batch:
            state = outcome.get(attempt.id)
            if state is None:
                _stale(attempt, "failed")
            else:
                metrics.TASKS_COMPLETED.labels(attempt.queue, "retried" if state == "retrying" else "failed").inc()
                log.info("task %s attempt %s %s: %s", attempt.id, attempt.attempt,
                         "will retry" if state == "retrying" else "failed", error.get("message"),
                         extra={"task_id": attempt.id, "task": attempt.task, "error_type": error.get("type")})
        return [b[0] for b in batch]


def _stale(attempt: Attempt, outcome: str) -> None:
    metrics.STALE_COMPLETIONS.inc()
    log.warning("discarded stale %s result of task %s: lease token %s is no longer current",
                outcome, attempt.id, attempt.token,
                extra={"task_id": attempt.id, "lease_token": attempt.token})
