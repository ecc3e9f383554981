"""One attempt, from claim to outcome: the per-attempt states of docs/state-machine.md.

Processing decodes what the claim returned (payload, run, checkpoint), runs the handler under the
attempt's deadline, and encodes its result; ReportingSuccess or ReportingFailure hands the outcome
to the completer, which writes it in a batch, and frees the attempt's slot at once. Whatever goes
wrong in a handler, or in what it returned, becomes the attempt's failure, never the worker's: an
attempt that was abandoned meanwhile (lease lost, fenced, drained) reports nothing. An async handler
that ignores the cancellation of its hard deadline does not hold its task: the fence duty fails the
attempt a grace period after the deadline (`fail_ignored_deadlines`), and whatever the handler ends
with later is discarded, as an abandoned attempt's is.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Iterable
from typing import Any

from .. import dsn as dsn_text
from .. import jsonvalue, metrics, tracing
from ..backoff import retry_delay
from ..settings import WorkerSettings
from .attempt import Attempt
from .completer import Completer
from .external import KILL_GRACE_SECONDS
from .handlers import (CANCELLED, DEADLINE, CancelledByHandler, Continue, DeadlineExceeded,
                       HandlerThreads, PermanentError, Registry, RetryAfter, RunInfo, Snooze, UnknownTaskError,
                       run_handler)

log = logging.getLogger("queueworker.worker")

TRACEBACK_LIMIT = 4000
MESSAGE_LIMIT = 2000
# Results larger than this fail their task ("result not storable"): a queue row is no blob store,
# and Postgres refuses jsonb values past 256 MB anyway.
RESULT_LIMIT_BYTES = 64 * 1024 * 1024
# How long after its hard deadline an async handler may still run before its attempt is failed
# without it: longer than the cleanup any handler of queueworker's own does once cancelled (an
# external command's process group is given KILL_GRACE_SECONDS between SIGTERM and SIGKILL).
IGNORED_DEADLINE_SECONDS = 2 * KILL_GRACE_SECONDS


class AttemptProcessor:
    """Runs attempts with the handlers of `registry` and reports their outcomes to `completer`,
    setting `slot_freed` as each one's handler is done. Error text is stored with `secrets` (the
    worker's connection string and password, which a handler may put in a message) scrubbed."""

    def __init__(self, registry: Registry, threads: HandlerThreads, completer: Completer, settings: WorkerSettings,
                 secrets: tuple[str, str | None], slot_freed: asyncio.Event):
        self._registry = registry
        self._threads = threads
        self._completer = completer
        self._settings = settings
        self._secrets = secrets
        self._slot_freed = slot_freed

    async def traced(self, attempt: Attempt) -> None:
        """The attempt in a span of its own, when tracing is set up (queueworker.tracing)."""
        with tracing.attempt_span(attempt) as span:
            tracing.record_outcome(span, *await self.run(attempt))

    async def run(self, attempt: Attempt) -> tuple[str, str | None]:
        """Processing, then ReportingSuccess or ReportingFailure (through the completer). Returns the
        outcome (tracing.record_outcome) and the error's type, if any."""
        loop = asyncio.get_running_loop()
        try:
            try:
                payload = jsonvalue.decode(attempt.payload_json)
            except jsonvalue.Undecodable as exc:
                raise PermanentError(f"payload cannot be decoded: {exc}") from None
            if attempt.run_json is not None:
                try:
                    attempt.ctx.run = RunInfo.from_json(attempt.run_json)
                except jsonvalue.Undecodable as exc:
                    raise PermanentError(f"the run's watermark cannot be decoded: {exc}") from None
            if attempt.checkpoint_json is not None:
                try:
                    attempt.ctx.checkpoint = jsonvalue.decode(attempt.checkpoint_json)
                except jsonvalue.Undecodable as exc:
                    raise PermanentError(f"the checkpoint cannot be decoded: {exc}") from None
            handler = self._registry.get(attempt.task)
            result = await run_handler(handler, payload, attempt.ctx, attempt.deadline - loop.time(), self._threads)
            continuation = result if isinstance(result, Continue) else None
            if continuation is not None:
                result = continuation.result
                if attempt.ctx.run is not None and attempt.ctx.run.partition is None:
                    raise PermanentError("a run's consolidation or alert cannot continue: the run ends with it")
            try:
                encoded = None if result is None else jsonvalue.encode(result, RESULT_LIMIT_BYTES)
            except jsonvalue.NotStorable as exc:
                raise PermanentError(f"result not storable: {exc}") from None
            if continuation is not None:
                try:
                    next_payload = jsonvalue.encode(continuation.payload, RESULT_LIMIT_BYTES)
                except jsonvalue.NotStorable as exc:
                    raise PermanentError(f"the continuation's payload is not storable: {exc}") from None
        except asyncio.CancelledError:
            if not attempt.settled:  # nobody here cancelled it: the handler cancelled its own task
                return self._report_failure(attempt, CancelledByHandler("the handler cancelled its own task"))
        except BaseException as exc:  # noqa: BLE001 - every handler failure is reported, never lost
            if not attempt.settled:
                return self._report_failure(attempt, exc)
        else:
            if not attempt.settled:
                if continuation is None:
                    self._completer.succeed(attempt, encoded)
                else:
                    next_headers = tracing.current_headers()  # the next page's parent: this attempt
                    self._completer.continue_with(attempt, encoded, next_payload, continuation.delay or 0.0,
                                                  None if next_headers is None else jsonvalue.encode(next_headers))
                self._slot_freed.set()
                return attempt.outcome, None
        finally:
            metrics.task_duration(attempt.queue, attempt.task if attempt.task in self._registry
                                  else "unknown").observe(loop.time() - attempt.started)
        return (attempt.ctx.cancel_reason or CANCELLED).replace(" ", "_"), None  # abandoned: its stop reason

    def fail_ignored_deadlines(self, attempts: Iterable[Attempt]) -> None:
        """Fails, as DeadlineExceeded, the attempts whose handler still runs IGNORED_DEADLINE_SECONDS
        after its hard deadline: an async handler that caught the deadline's cancellation and went
        on (a sync one's attempt gives up on its thread at the deadline itself). Its slot is free
        and its task retried or failed as its attempts allow; the coroutine is left to run, and
        whatever it ends with is discarded (the attempt is settled)."""
        now = asyncio.get_running_loop().time()
        for attempt in [a for a in attempts if not a.settled and now >= a.deadline + IGNORED_DEADLINE_SECONDS
                        and a.runner is not None and not a.runner.done()]:
            log.warning("async handler of task %s (%s) ignored the cancellation of its hard deadline %.0f s ago: "
                        "failed as DeadlineExceeded, its coroutine left running", attempt.id, attempt.task,
                        now - attempt.deadline, extra={"task_id": attempt.id, "task": attempt.task})
            attempt.ctx.stop(DEADLINE)  # `ctx.cancelled`, for a handler that looks at it
            self._report_failure(attempt, DeadlineExceeded("hard deadline exceeded: the handler ignored its "
                                                           "cancellation"))

    def _report_failure(self, attempt: Attempt, exc: BaseException) -> tuple[str, str | None]:
        """Hands the failure to the completer; returns the outcome (as the completer labels it) and
        the error's type."""
        if isinstance(exc, Snooze):
            self._completer.snooze(attempt, exc.seconds, {"type": "Snoozed", "message": str(exc), "retryable": True,
                                                           "attempt": attempt.attempt})
            self._slot_freed.set()
            return attempt.outcome, None
        settings = self._settings
        retryable = not isinstance(exc, PermanentError)
        error_type = "DeadlineExceeded" if isinstance(exc, DeadlineExceeded) else type(exc).__name__
        error: dict[str, Any] = {"type": error_type, "message": self._storable_text(_describe(exc), MESSAGE_LIMIT),
                                 "retryable": retryable, "attempt": attempt.attempt}
        if not isinstance(exc, (UnknownTaskError, DeadlineExceeded, CancelledByHandler, RetryAfter)):
            error["traceback"] = self._storable_text(_format_traceback(exc), TRACEBACK_LIMIT, keep_end=True)
        if isinstance(exc, UnknownTaskError):
            self._completer.hand_back_unknown(attempt, error)
        else:
            backoff = (min(exc.seconds, settings.retry_max_seconds) if isinstance(exc, RetryAfter) else
                       retry_delay(attempt.attempt, settings.retry_base_seconds, settings.retry_max_seconds))
            self._completer.fail(attempt, retryable, backoff, error)
        self._slot_freed.set()
        return attempt.outcome, error_type

    def _storable_text(self, text: str, limit: int, keep_end: bool = False) -> str:
        return jsonvalue.safe_text(dsn_text.scrub(text, self._secrets), limit=limit, keep_end=keep_end)


def _describe(exc: BaseException) -> str:
    """str(exc), which is user code and may itself raise."""
    try:
        return str(exc) or type(exc).__name__
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the failure
        return f"{type(exc).__name__} (its message could not be rendered)"


def _format_traceback(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(exc))
    except Exception:  # noqa: BLE001 - same as above: the traceback renders the message too
        return "".join(traceback.format_tb(exc.__traceback__))
