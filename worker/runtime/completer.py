"""Batched, fenced completion: outcomes are buffered and flushed in one statement per kind.

Outcomes stay buffered through any error that is not about their content (connection lost, server
restarting, a bug) and are retried. A batch the database refuses for what is in it (a result Postgres will not store, a
constraint) is written again row by row, so the innocent outcomes land and only the bad one is
turned into a permanent failure that says why. Rows whose lease moved on are reported by the
database as not updated, counted as stale and dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from .. import jsonvalue, metrics
from .attempt import Attempt
from ..db.connection import CLIENT_TIMEOUT_SECONDS, DutyConnection
from ..db.lease import (COMPLETE_CONTINUED, COMPLETE_FAILED, COMPLETE_SUCCEEDED, GENERIC_COMPLETION, HAND_BACK,
                        CompleteContinuedParams, CompleteFailedParams, CompleteSucceededParams, FencedRow,
                        HandBackParams)
from .flow import FlowControl
from .signals import WorkerSignals

log = logging.getLogger("queueworker.completer")

# Unknown task names are handed back for this long before a worker tries again (rolling deploys).
UNKNOWN_TASK_RETRY_SECONDS = 10.0
# What is kept of a database's refusal in the error of the task it failed.
REFUSAL_TEXT_LIMIT = 500
# Result bytes one completion statement carries at most (a single larger result goes alone).
BATCH_RESULT_BYTES = 64 * 1024 * 1024
# Result bytes waiting for a flush above which the worker keeps no more outcomes waiting than it
# has slots (Worker._free_slots): small results may wait a whole batch deep, large ones may not.
BACKLOG_RESULT_BYTES = 8 * 1024 * 1024


def _result_bytes(outcome: Any) -> int:
    if isinstance(outcome, Success):
        return len(outcome.result_json or "")
    if isinstance(outcome, Continued):
        return len(outcome.result_json or "") + len(outcome.next_payload_json)
    return 0


@dataclass(slots=True)
class Success:
    attempt: Attempt
    result_json: str | None

    label = "succeeded"


@dataclass(slots=True)
class Failure:
    attempt: Attempt
    retryable: bool
    backoff_seconds: float
    error: dict[str, Any]

    def __post_init__(self) -> None:
        self.attempt.failed = True  # on its way to a circuit breaker, if its queue has one: hold claims

    @property
    def label(self) -> str:
        attempt = self.attempt  # as complete_failed decides
        return "retrying" if self.retryable and attempt.attempt < attempt.max_attempts else "failed"


@dataclass(slots=True)
class Continued:
    attempt: Attempt
    result_json: str | None
    next_payload_json: str
    delay_seconds: float
    next_headers_json: str | None  # the attempt's trace context; None: the page keeps the task's headers

    label = "continued"


@dataclass(slots=True)
class HandBack:
    """Back to pending without consuming the attempt: a snooze (grace None), or a task no handler
    here knows, while younger than the grace period (it fails after)."""

    attempt: Attempt
    delay_seconds: float
    error: dict[str, Any]
    grace_seconds: float | None

    @property
    def label(self) -> str:
        return "snoozed" if self.grace_seconds is None else "handed_back"


Outcome = Success | Continued | Failure | HandBack


class Completer:
    def __init__(self, conn: DutyConnection, flush_interval: float, max_batch: int,
                 on_flushed: Callable[[list[Attempt]], None], on_waiting: Callable[[], None],
                 unknown_task_grace_seconds: float, signals: WorkerSignals, flow: FlowControl | None = None):
        self._conn = conn
        self._signals = signals  # told of every completion statement before it goes out
        self._on_waiting = on_waiting  # tasks now wait for a time: the scheduler must know when they are due
        self._flush_interval = flush_interval
        self._max_batch = max_batch
        self._on_flushed = on_flushed
        self._unknown_task_grace = unknown_task_grace_seconds
        self._flow = flow  # told the outcomes of queues that have a circuit breaker, or key limits
        self._buffers: dict[type, list[Any]] = {Success: [], Continued: [], Failure: [], HandBack: []}
        self._writes: dict[type, Callable[[list[Any], float], Awaitable[list[Attempt]]]] = {
            Success: self._write_successes, Continued: self._write_continued, Failure: self._write_failures,
            HandBack: self._write_hand_backs}
        self.pending = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self.buffered_result_bytes = 0

    def succeed(self, attempt: Attempt, result_json: str | None) -> None:
        self._add(Success(attempt, result_json))

    def fail(self, attempt: Attempt, retryable: bool, backoff_seconds: float, error: dict[str, Any]) -> None:
        self._add(Failure(attempt, retryable, backoff_seconds, error))

    def continue_with(self, attempt: Attempt, result_json: str | None, next_payload_json: str,
                      delay_seconds: float, next_headers_json: str | None = None) -> None:
        self._add(Continued(attempt, result_json, next_payload_json, delay_seconds, next_headers_json))

    def snooze(self, attempt: Attempt, delay_seconds: float, error: dict[str, Any]) -> None:
        self._add(HandBack(attempt, delay_seconds, error, None))

    def hand_back_unknown(self, attempt: Attempt, error: dict[str, Any]) -> None:
        """No handler here knows the task's name: defer it while it is young, fail it after."""
        self._add(HandBack(attempt, UNKNOWN_TASK_RETRY_SECONDS, {**error, "retryable": True},
                           self._unknown_task_grace))

    def _add(self, outcome: Outcome) -> None:
        outcome.attempt.reporting = True
        outcome.attempt.outcome = outcome.label
        self._buffers[type(outcome)].append(outcome)
        self.buffered_result_bytes += _result_bytes(outcome)
        self.pending.set()

    @property
    def buffered(self) -> int:
        return sum(len(buffer) for buffer in self._buffers.values())

    async def step(self) -> float | None:
        """One pass of the flush duty: let a batch gather briefly, flush it. The supervisor waits
        for `pending` when this returns None, and comes back at once while outcomes remain."""
        if not self.buffered:
            return None
        if self.buffered < self._max_batch and self._flush_interval:
            await asyncio.sleep(self._flush_interval)
        await self.flush()
        return 0.0 if self.buffered else None

    async def flush(self, timeout: float = CLIENT_TIMEOUT_SECONDS) -> None:
        """Writes up to a batch of each kind of buffered outcome, each statement within `timeout`.
        On an error that is not about their content, the outcomes stay buffered and the error is
        raised. Waits for a flush already under way, so a caller that flushes until nothing is
        buffered knows every outcome was written."""
        async with self._flush_lock:
            for kind in (HandBack, Success, Continued, Failure):  # unknown tasks may turn into failures
                batch = self._take(kind)
                if batch:
                    self._on_flushed(await self._write_batch(kind, batch, timeout))

    async def drain(self, timeout: float) -> None:
        """Flushes until nothing is buffered (shutdown), its statements within `timeout` seconds
        in all. Each flush first waits for one under way, which may put outcomes back (an error, a
        refused outcome turned into a failure): so the buffer is checked only after our own."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            await self.flush(max(0.0, deadline - loop.time()))
            if not self.buffered:
                return

    def _take(self, kind: type) -> list[Any]:
        """Up to max_batch outcomes, and no more result bytes than BATCH_RESULT_BYTES (but at least
        one outcome): a statement carrying many large results could pass Postgres's 1 GiB limit."""
        buffer = self._buffers[kind]
        count = min(len(buffer), self._max_batch)
        size = 0
        if kind in (Success, Continued):
            for position, outcome in enumerate(buffer[:count]):
                if position and size + _result_bytes(outcome) > BATCH_RESULT_BYTES:
                    count = position
                    break
                size += _result_bytes(outcome)
        batch, self._buffers[kind] = buffer[:count], buffer[count:]
        self.buffered_result_bytes -= size
        return batch

    def _put_back(self, kind: type, outcomes: list[Any]) -> None:
        self._buffers[kind][:0] = outcomes
        self.buffered_result_bytes += sum(_result_bytes(outcome) for outcome in outcomes)
        self.pending.set()

    async def _write_batch(self, kind: type, batch: list[Any], timeout: float) -> list[Attempt]:
        """One statement for the batch; if the database refuses it for its content, one per row.
        Any other error puts the batch back and is raised (the supervisor logs it and retries)."""
        write = self._writes[kind]
        # In id order: a transaction settling new dependents locks their prerequisites in id order
        # too (migrations/functions/40_dependencies.sql), which makes a deadlock between the two rare.
        batch = sorted(batch, key=lambda outcome: outcome.attempt.id)
        try:
            self._signals.completing.emit(len(batch))
            return await write(batch, timeout)
        except Exception as exc:
            if not refused_for_content(exc):
                self._put_back(kind, batch)
                raise
            if len(batch) == 1:
                return self._refused(batch[0], exc)
            log.warning("a batch of %d outcomes was refused (%s); writing them one by one",
                        len(batch), _refusal(exc), extra={"outcomes": len(batch)})
        done: list[Attempt] = []
        for position, outcome in enumerate(batch):
            try:
                self._signals.completing.emit(1)
                done += await write([outcome], timeout)
            except Exception as exc:
                if not refused_for_content(exc):
                    self._put_back(kind, batch[position:])
                    self._on_flushed(done)
                    raise
                done += self._refused(outcome, exc)
        return done

    def _refused(self, outcome: Outcome, exc: BaseException) -> list[Attempt]:
        """The database will not store this outcome: fail the task permanently with an error that
        says why (an error is always storable), or give up on a failure that still was not."""
        attempt = outcome.attempt
        if isinstance(outcome, Failure) and outcome.error.get("type") == "OutcomeNotStorable":
            log.error("task %s: even a plain error could not be stored (%s); leaving the lease to expire",
                      attempt.id, _refusal(exc), extra={"task_id": attempt.id})
            return [attempt]
        metrics.UNSTORABLE_OUTCOMES.labels(attempt.queue).inc()
        what = "result" if isinstance(outcome, (Success, Continued)) else "outcome"
        message = f"{what} not storable: {_refusal(exc)}"
        log.error("task %s attempt %s: %s", attempt.id, attempt.attempt, message,
                  extra={"task_id": attempt.id, "task": attempt.task})
        self._put_back(Failure, [Failure(attempt, False, 0.0, {
            "type": "OutcomeNotStorable", "message": message, "retryable": False, "attempt": attempt.attempt})])
        return []

    async def _write_successes(self, batch: list[Success], timeout: float) -> list[Attempt]:
        rows = await self._conn.fetch(COMPLETE_SUCCEEDED, CompleteSucceededParams(
            ids=[s.attempt.id for s in batch], tokens=[s.attempt.token for s in batch],
            results=[s.result_json for s in batch]), timeout=timeout, first=GENERIC_COMPLETION)
        return self._count_succeeded(batch, rows, "succeeded")

    async def _write_continued(self, batch: list[Continued], timeout: float) -> list[Attempt]:
        rows = await self._conn.fetch(COMPLETE_CONTINUED, CompleteContinuedParams(
            ids=[c.attempt.id for c in batch], tokens=[c.attempt.token for c in batch],
            results=[c.result_json for c in batch], next_payloads=[c.next_payload_json for c in batch],
            next_delays=[c.delay_seconds for c in batch],
            next_headers=[c.next_headers_json for c in batch]), timeout=timeout)
        if any(c.delay_seconds for c in batch):
            self._on_waiting()
        return self._count_succeeded(batch, rows, "continued")

    def _count_succeeded(self, batch: list[Success] | list[Continued], rows: list[FencedRow],
                         outcome: str) -> list[Attempt]:
        attempts = [s.attempt for s in batch]
        if len(rows) == len(batch):  # every lease was still held: the common case, checked cheaply
            stale = []
        else:
            updated = {(row.id, row.lease_token) for row in rows}
            stale = [attempt for attempt in attempts if attempt.key not in updated]
            for attempt in stale:
                _stale(attempt, outcome)
        stale_keys = {attempt.key for attempt in stale}
        for queue, count in Counter(a.queue for a in attempts if a.key not in stale_keys).items():
            metrics.TASKS_COMPLETED.labels(queue, outcome).inc(count)
        self._note([a for a in attempts if a.key not in stale_keys])
        return attempts

    def _note(self, attempts: list[Attempt], succeeded: bool = True) -> None:
        """Outcomes written, for the circuit breakers of the queues that have one and for the keys
        of key-limited queues (their health, their breakers)."""
        flow = self._flow
        if flow is not None and (flow.breaker_queues or flow.key_queues):
            for attempt in attempts:
                if attempt.queue in flow.breaker_queues:
                    flow.note(attempt.queue, succeeded)
                if attempt.queue in flow.key_queues:
                    flow.note_key(attempt.queue, attempt.ctx.key, succeeded)

    async def _write_failures(self, batch: list[Failure], timeout: float) -> list[Attempt]:
        rows = await self._conn.fetch(COMPLETE_FAILED, CompleteFailedParams(
            ids=[f.attempt.id for f in batch], tokens=[f.attempt.token for f in batch],
            retryables=[f.retryable for f in batch], backoffs=[f.backoff_seconds for f in batch],
            errors=[_error_json(f.error) for f in batch]), timeout=timeout)
        recorded = {(row.id, row.lease_token): row.state for row in rows}
        if "retrying" in recorded.values():
            self._on_waiting()
        for failure in batch:
            attempt, state = failure.attempt, recorded.get(failure.attempt.key)
            if state is None:
                _stale(attempt, "failed")
                continue
            metrics.TASKS_COMPLETED.labels(attempt.queue, "retried" if state == "retrying" else "failed").inc()
            self._note([attempt], succeeded=False)
            log.info("task %s attempt %s %s: %s", attempt.id, attempt.attempt,
                     "will retry" if state == "retrying" else "failed", failure.error.get("message"),
                     extra={"task_id": attempt.id, "task": attempt.task, "error_type": failure.error.get("type")})
        return [f.attempt for f in batch]

    async def _write_hand_backs(self, batch: list[HandBack], timeout: float) -> list[Attempt]:
        """Snoozes and young unknown tasks go back to pending; an unknown task past its grace becomes
        a permanent failure, written right after (in this flush, or the next when the failure buffer
        holds more than a batch)."""
        rows = await self._conn.fetch(HAND_BACK, HandBackParams(
            ids=[h.attempt.id for h in batch], tokens=[h.attempt.token for h in batch],
            delays=[h.delay_seconds for h in batch], errors=[_error_json(h.error) for h in batch],
            graces=[h.grace_seconds for h in batch]), timeout=timeout)
        handed_back = {(row.id, row.lease_token) for row in rows}
        if handed_back:
            self._on_waiting()
        for hand_back in batch:
            attempt = hand_back.attempt
            if attempt.key in handed_back:
                if hand_back.grace_seconds is None:
                    metrics.TASKS_COMPLETED.labels(attempt.queue, "snoozed").inc()
                else:
                    metrics.TASKS_DEFERRED.labels(attempt.queue).inc()
                    log.warning("task %s: %s; handed back for %.0f s (a newer worker may know it)", attempt.id,
                                hand_back.error["message"], hand_back.delay_seconds,
                                extra={"task_id": attempt.id, "task": attempt.task})
            elif hand_back.grace_seconds is None:
                _stale(attempt, "snoozed")
            else:  # older than the grace period (or stale: the fenced failure will say so)
                self._buffers[Failure].append(Failure(attempt, False, 0.0, {**hand_back.error, "retryable": False}))
        return [h.attempt for h in batch if h.attempt.key in handed_back or h.grace_seconds is None]


def refused_for_content(exc: BaseException) -> bool:
    """Whether the database refused a write because of the values in it (SQLSTATE classes 22 data
    exception, 23 integrity constraint, 54 program limit such as a jsonb too large), or the driver
    could not send them: the fault of one row, not of the database or of our code."""
    if not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate is None:
        return isinstance(exc, psycopg.DataError)
    return exc.sqlstate[:2] in ("22", "23", "54")


def _error_json(error: dict[str, Any]) -> str:
    """Errors are built from safe text, so this only fails on a bug; even then the task gets an error."""
    try:
        return jsonvalue.encode(error)
    except jsonvalue.NotStorable as exc:
        return jsonvalue.encode({"type": "OutcomeNotStorable", "message": f"error not storable: {exc}",
                                 "retryable": bool(error.get("retryable"))})


def _refusal(exc: BaseException) -> str:
    """What the database said, safe to store and to log."""
    diag = getattr(exc, "diag", None)
    text = (diag.message_primary if diag is not None and diag.message_primary else None) or str(exc) \
        or type(exc).__name__
    return jsonvalue.safe_text(text.strip().splitlines()[0], limit=REFUSAL_TEXT_LIMIT)


def _stale(attempt: Attempt, outcome: str) -> None:
    metrics.STALE_COMPLETIONS.inc()
    log.warning("discarded stale %s result of task %s: lease token %s is no longer current",
                outcome, attempt.id, attempt.token,
                extra={"task_id": attempt.id, "lease_token": attempt.token})
