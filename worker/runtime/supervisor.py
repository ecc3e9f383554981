"""The one shape every background duty of a worker has.

A duty is a pass (`step`) that returns how long to wait before the next one. The supervisor owns
everything around it: waiting (until the delay passes or the duty is woken), jitter, error
counting, logging and backoff. An error never ends a duty: a database error that is expected to
heal (connection lost, server restarting, lock or statement timeout) is logged on one line; any
other exception — a bug, a bad row, a permission the role lacks — is logged with its traceback.
Both are counted, the duty waits in ErrorWait with capped exponential backoff, and tries again.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

import psycopg

from .. import dsn as dsn_text
from .. import metrics
from ..backoff import error_wait
from ..events import wait_event
from .signals import DutyPass, WorkerSignals

# SQLSTATE classes of errors that heal by themselves: connection exceptions, insufficient
# resources, operator intervention (admin shutdown, crash recovery, statement or lock timeout
# cancellations), and transaction rollbacks (serialization failure, deadlock).
_TRANSIENT_CLASSES = ("08", "53", "57", "40")
_TRANSIENT_STATES = {"55P03", "55006"}  # lock_not_available, object_in_use


def is_transient(exc: BaseException) -> bool:
    """Whether a database error is expected to heal on its own (retry quietly), as opposed to a
    bug or a misconfiguration that will fail the same way every time."""
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state is None:  # raised by the client: connection lost, connect timeout, server gone
        return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))
    return state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES


class ErrorStreak:
    """Consecutive failures of one duty: counted, logged, and turned into a backoff."""

    def __init__(self, duty: str, log: logging.Logger, dsn: str | None = None, cap_seconds: float = 10.0,
                 expected: tuple[type[BaseException], ...] = (), failed: str | None = None):
        self.duty = duty
        self._failed = failed or f"{duty} failed"  # how log lines begin
        self._expected = expected  # exception types that are part of normal operation: one line, no traceback
        self._log = log
        self._dsn = dsn
        self._cap = cap_seconds
        self.failures = 0
        self.unexpected = 0  # consecutive failures that were not transient database errors

    def record(self, exc: BaseException) -> float:
        """Counts and logs one failure; returns how long to wait before trying again."""
        self.failures += 1
        if isinstance(exc, self._expected):
            self._log.warning("%s, will retry: %s", self._failed, exc,
                              extra={"duty": self.duty, "failures": self.failures})
        elif is_transient(exc):
            metrics.DB_ERRORS.labels(self.duty).inc()
            self._log.warning("%s, will retry: %s", self._failed, dsn_text.explain(exc, self._dsn),
                              extra={"duty": self.duty, "failures": self.failures})
        else:
            self.unexpected += 1
            metrics.UNEXPECTED_ERRORS.labels(self.duty).inc()
            self._log.error("%s unexpectedly, will retry: %s: %s", self._failed, type(exc).__name__,
                            dsn_text.explain(exc, self._dsn), exc_info=exc,
                            extra={"duty": self.duty, "failures": self.failures})
        return error_wait(self.failures, cap=self._cap)

    def succeeded(self) -> None:
        if self.failures:
            self._log.info("%s recovered after %d failures", self.duty, self.failures, extra={"duty": self.duty})
        self.failures = self.unexpected = 0


Step = Callable[[], Awaitable[float | None]]


async def supervise(duty: str, step: Step, log: logging.Logger, signals: WorkerSignals, *,
                    wake: asyncio.Event | None = None, first_delay: float | None = 0.0, jitter: float = 0.0,
                    dsn: str | None = None, error_cap_seconds: float = 10.0) -> None:
    """Runs `step` forever. It returns the seconds to wait before the next pass (None: until
    woken, for duties that have a `wake` event); `wake` cuts such a wait short, but never an
    ErrorWait (a duty that fails must not hammer the database however often it is woken), which
    grows up to `error_cap_seconds`. `jitter` spreads every wait by ±that fraction, so workers
    started together do not meet at the same moment. A CancelledError that does not come from
    cancelling the duty itself is an error like any other. Each pass's start and end are told to
    the worker's `signals`. A step that swallows the cancellation of its duty (asyncio.wait_for does,
    on Python 3.11, when the cancellation comes as what it waits for arrives) does not keep the duty
    going: the next pass sees the request and ends it, and the worker's shutdown does not hang."""
    streak = ErrorStreak(duty, log, dsn, cap_seconds=error_cap_seconds)
    passes = metrics.DUTY_PASSES.labels(duty)
    delay = first_delay
    this = asyncio.current_task()  # supervise runs as a task of its own: never None
    while True:
        if this.cancelling():
            raise asyncio.CancelledError(f"{duty}: cancelled during a pass that went on")
        if streak.failures:
            await asyncio.sleep(delay or 0)
        elif delay is None or delay > 0:
            spread = delay * random.uniform(1 - jitter, 1 + jitter) if delay and jitter else delay
            if wake is None:
                await asyncio.sleep(spread or 0)
            else:
                await wait_event(wake, spread)
        if wake is not None:
            wake.clear()
        passes.inc()
        try:
            signals.duty_started.emit(duty)
            try:
                delay = await step()
            except BaseException:
                signals.duty_ended.emit(DutyPass(duty, None, failed=True))
                raise
            signals.duty_ended.emit(DutyPass(duty, delay))
            if delay is None and wake is None:
                raise TypeError(f"{duty}: a duty without a wake event must say when to run next")
        except asyncio.CancelledError as exc:
            if this.cancelling():
                raise
            delay = streak.record(exc)
        except Exception as exc:  # noqa: BLE001 - no error may end a duty; each one is logged and counted
            delay = streak.record(exc)
        else:
            streak.succeeded()
