"""The worker process: the lease loop of docs/state-machine.md.

The fetch loop claims pending tasks in batches sized by free slots and hands each attempt to
its handler; the completer flushes outcomes in batches; the heartbeater keeps leases alive;
the rescuer and scheduler run the queue's background duties; the listener wakes the fetch loop.
On SIGTERM/SIGINT the worker drains: stop claiming, let attempts finish until the drain
deadline, cancel the rest and hand their leases back without consuming an attempt.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import signal
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from . import metrics, sql
from .attempt import Attempt
from .backoff import error_wait, retry_delay
from .builtin_tasks import register_builtin_tasks
from .cleaner import Cleaner
from .completer import Completer
from .db import DutyConnection
from .events import wait_event
from .handlers import PermanentError, Registry, TaskContext, UnknownTaskError, run_handler
from .heartbeat import Heartbeater, WorkerIdentity
from .listener import Listener
from .migrate import latest_version, migrate
from .rescuer import Rescuer
from .scheduler import Scheduler
from .settings import WorkerSettings

log = logging.getLogger("queueworker.worker")
task_log = logging.getLogger("queueworker.task")

RELEASE_TIMEOUT = 10.0  # how long shutdown keeps retrying to hand leases back and flush
TRACEBACK_LIMIT = 4000


class State(enum.Enum):
    """The fetch loop's states (seed 000); the per-attempt states are Processing and Reporting*."""

    STARTUP = "Startup"
    CONNECTING = "Connecting"
    RECOVERY = "Recovery"
    POLLING = "Polling"
    CLAIMING = "Claiming"
    BACKOFF = "Backoff"
    IDLE = "Idle"
    ERROR_WAIT = "ErrorWait"
    DRAINING = "Draining"
    STOPPED = "Stopped"


class Worker:
    def __init__(self, dsn: str, settings: WorkerSettings, registry: Registry, auto_migrate: bool = False):
        self.settings = settings
        self.registry = registry
        register_builtin_tasks(registry)
        self.identity = WorkerIdentity.for_this_process(settings.queues, settings.concurrency)
        self._dsn = dsn
        self._auto_migrate = auto_migrate
        self._claim_conn = DutyConnection(dsn, "queueworker-claim")
        self._complete_conn = DutyConnection(dsn, "queueworker-complete")
        self._duty_conn = DutyConnection(dsn, "queueworker-duty")
        self._inflight: dict[int, Attempt] = {}
        self._executor = ThreadPoolExecutor(max_workers=settings.concurrency, thread_name_prefix="handler")
        self.state = State.STARTUP
        self._stopping = False
        self._draining = False
        self._stop_requested: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._wakeup: asyncio.Event | None = None
        self._slot_freed: asyncio.Event | None = None
        self.scheduler = Scheduler(self._duty_conn, settings.scheduler_max_interval_seconds)
        self.completer = Completer(self._complete_conn, settings.flush_interval_seconds,
                                   settings.flush_max_batch, self._flushed, on_retrying=self.scheduler.poke)
        # Heartbeats share the completer's connection, so one never runs while a flush is moving
        # the same rows to `tasks_finished` (which would make it re-run: see db.met_moved_row).
        self.heartbeater = Heartbeater(self._complete_conn, self.identity, settings.heartbeat_seconds,
                                       settings.lease_seconds, lambda: list(self._inflight.values()),
                                       lambda: self._draining, self._leases_lost)
        self.rescuer = Rescuer(self._duty_conn, settings.rescue_interval_seconds,
                               settings.deadline_grace_seconds, settings.worker_ttl_seconds)
        self.cleaner = Cleaner(self._duty_conn, settings.retention_seconds, settings.cleaner_interval_seconds)
        self.listener = Listener(dsn, settings.queues, self._wake_at)

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self) -> int:
        """Runs until stopped by a signal (or request_stop); returns the process exit code."""
        loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        self._hurry = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._slot_freed = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        log.info("worker starting", extra={"worker_id": str(self.identity.id), "queues": list(self.settings.queues),
                                           "concurrency": self.settings.concurrency,
                                           "tasks": self.registry.names()})
        duties: list[asyncio.Task] = []
        try:
            if not await self._connect():
                return 0
            self._set_state(State.RECOVERY)
            await self._recover_at_start()
            background = {"listener": self.listener.run(), "heartbeat": self.heartbeater.run(),
                          "rescuer": self.rescuer.run(), "scheduler": self.scheduler.run(),
                          "completer": self.completer.run()}
            if self.settings.retention_seconds:
                background["cleaner"] = self.cleaner.run()
            duties = [asyncio.create_task(coro, name=name) for name, coro in background.items()]
            fetch = asyncio.create_task(self._fetch_loop(), name="fetch")
            await self._stop_requested.wait()
            # Let the fetch loop stop on its own: cancelling it mid-claim would lose the claimed rows.
            self._wakeup.set()
            self._slot_freed.set()
            await asyncio.gather(fetch, return_exceptions=True)
            return await self._drain(duties)
        finally:
            for duty in duties:
                duty.cancel()
            await asyncio.gather(*duties, return_exceptions=True)
            for conn in (self._claim_conn, self._complete_conn, self._duty_conn):
                await conn.close()
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._set_state(State.STOPPED)

    def request_stop(self) -> None:
        """First call: drain. Second call: shorten the drain to zero."""
        if self._stopping:
            log.warning("second stop signal: cancelling remaining attempts now")
            self._hurry.set()
            return
        log.info("stop requested: draining", extra={"drain_seconds": self.settings.drain_seconds})
        self._stopping = True
        self._stop_requested.set()

    async def _connect(self) -> bool:
        """Connecting: register the worker row once the schema is there. False if stopped first."""
        self._set_state(State.CONNECTING)
        failures = 0
        while not self._stopping:
            try:
                if self._auto_migrate:
                    await asyncio.to_thread(migrate, self._dsn)
                await self._check_schema()
                await self.heartbeater.beat()
                return True
            except (psycopg.Error, _SchemaMissing) as exc:
                failures += 1
                metrics.DB_ERRORS.labels("connect").inc()
                self._set_state(State.ERROR_WAIT)
                log.error("cannot start: %s", exc)
                await self._sleep_unless_stopped(error_wait(failures, cap=30.0))
                self._set_state(State.CONNECTING)
        return False

    async def _check_schema(self) -> None:
        (exists,), = await self._duty_conn.fetch(sql.SCHEMA_EXISTS)
        version = (await self._duty_conn.fetch(sql.SCHEMA_VERSION))[0][0] if exists else 0
        if version < latest_version():
            raise _SchemaMissing(f"database schema is at version {version}, this worker needs "
                                 f"{latest_version()}: run `queueworker migrate` (or start the worker with --migrate)")

    async def _recover_at_start(self) -> None:
        try:
            await self.rescuer.rescue_once()
        except psycopg.Error as exc:
            log.warning("start-up recovery failed, the rescuer will retry: %s", exc)

    # -- fetch loop -----------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        idle_polls = 0
        failures = 0
        queues = list(self.settings.queues)
        while not self._stopping:
            self._set_state(State.POLLING)
            free = self._free_slots()
            if free <= 0:
                self._set_state(State.IDLE)
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            self._wakeup.clear()
            self._set_state(State.CLAIMING)
            try:
                claimed = 0
                for queue in queues:
                    claimed += await self._claim(queue, free - claimed)
                    if claimed >= free:
                        break
                queues.append(queues.pop(0))  # fairness between queues across rounds
                failures = 0
            except psycopg.Error as exc:
                failures += 1
                metrics.DB_ERRORS.labels("claim").inc()
                self._set_state(State.ERROR_WAIT)
                log.warning("claim failed: %s", exc)
                await self._sleep_unless_woken(error_wait(failures))
                continue
            if claimed:
                idle_polls = 0
                if claimed == free:
                    continue  # full batch: there may be more, claim again as soon as slots free up
            self._set_state(State.BACKOFF)
            idle_polls += 1
            interval = min(self.settings.poll_max_seconds,
                           self.settings.poll_min_seconds * 2 ** min(idle_polls - 1, 30))
            self._set_state(State.IDLE)
            await self._sleep_unless_woken(interval)

    def _free_slots(self) -> int:
        """Handlers that may start now. A finished handler frees its slot at once, so the next
        claim overlaps the flush of its outcome; outcomes waiting for a flush are bounded by
        the concurrency too, so a slow database stops claims instead of piling them up."""
        running = sum(1 for attempt in self._inflight.values() if not attempt.reporting)
        return min(self.settings.concurrency - running, 2 * self.settings.concurrency - len(self._inflight))

    async def _claim(self, queue: str, limit: int) -> int:
        rows = await self._claim_conn.fetch(sql.CLAIM, {
            "queue": queue, "limit": limit, "worker": self.identity.id,
            "lease_seconds": self.settings.lease_seconds,
            "timeout_seconds": self.settings.task_timeout_seconds})
        now = asyncio.get_running_loop().time()
        for task_id, queue_name, task, payload, attempt_no, max_attempts, token, to_deadline in rows:
            ctx = TaskContext(task_id, task, queue_name, attempt_no, max_attempts, task_log)
            attempt = Attempt(task_id, token, queue_name, task, payload, attempt_no, max_attempts,
                              now + to_deadline, ctx, started=now)
            self._inflight[task_id] = attempt
            attempt.runner = asyncio.create_task(self._process(attempt))
        if rows:
            metrics.TASKS_CLAIMED.labels(queue).inc(len(rows))
            metrics.IN_FLIGHT.set(len(self._inflight))
        return len(rows)

    # -- processing -----------------------------------------------------------------------

    async def _process(self, attempt: Attempt) -> None:
        """Processing, then ReportingSuccess or ReportingFailure (through the completer)."""
        loop = asyncio.get_running_loop()
        try:
            handler = self.registry.get(attempt.task)
            result = await run_handler(handler, attempt.payload, attempt.ctx, attempt.deadline - loop.time(),
                                       self._executor)
            encoded = None if result is None else _encode_result(result)
        except asyncio.CancelledError:
            if attempt.abandoned:
                return
            raise
        except BaseException as exc:  # noqa: BLE001 - every handler failure is reported, never lost
            if attempt.abandoned:
                return
            self._report_failure(attempt, exc)
        else:
            if not attempt.abandoned:
                self.completer.succeed(attempt, encoded)
                self._slot_freed.set()
        finally:
            metrics.task_duration(attempt.queue, attempt.task if attempt.task in self.registry
                                  else "unknown").observe(loop.time() - attempt.started)

    def _report_failure(self, attempt: Attempt, exc: BaseException) -> None:
        retryable = not isinstance(exc, PermanentError)
        if isinstance(exc, TimeoutError):
            error_type, message = "DeadlineExceeded", "hard deadline exceeded: attempt cancelled"
        else:
            error_type, message = type(exc).__name__, str(exc) or type(exc).__name__
        error = {"type": error_type, "message": message, "retryable": retryable, "attempt": attempt.attempt}
        if not isinstance(exc, (UnknownTaskError, TimeoutError)):
            error["traceback"] = "".join(traceback.format_exception(exc))[-TRACEBACK_LIMIT:]
        backoff = retry_delay(attempt.attempt, self.settings.retry_base_seconds, self.settings.retry_max_seconds)
        self.completer.fail(attempt, retryable, backoff, error)
        self._slot_freed.set()

    def _flushed(self, attempts: list[Attempt]) -> None:
        for attempt in attempts:
            self._inflight.pop(attempt.id, None)
        metrics.IN_FLIGHT.set(len(self._inflight))
        self._slot_freed.set()

    def _leases_lost(self, attempts: list[Attempt]) -> None:
        """The database no longer grants these leases: stop the handlers, free the slots."""
        for attempt in attempts:
            log.warning("lease lost for task %s (expired, cancelled or re-claimed): cancelling its handler",
                        attempt.id, extra={"task_id": attempt.id, "lease_token": attempt.token})
            self._abandon(attempt)
            self._inflight.pop(attempt.id, None)
        metrics.LEASES_LOST.inc(len(attempts))
        metrics.IN_FLIGHT.set(len(self._inflight))
        self._slot_freed.set()

    @staticmethod
    def _abandon(attempt: Attempt) -> None:
        attempt.abandoned = True
        attempt.ctx.cancelled.set()
        if attempt.runner is not None:
            attempt.runner.cancel()

    # -- wake-ups -------------------------------------------------------------------------

    def _wake_at(self, due_epoch: float) -> None:
        """Due now: claim. Due later: have the scheduler admit it then; its NOTIFY wakes us all."""
        delay = due_epoch - time.time()
        if delay <= 0:
            self._wakeup.set()
        else:
            asyncio.get_running_loop().call_later(delay, self.scheduler.poke)

    async def _sleep_unless_woken(self, seconds: float) -> None:
        await wait_event(self._wakeup, seconds)

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        await wait_event(self._stop_requested, seconds)

    def _set_state(self, state: State) -> None:
        if state is not self.state:
            metrics.WORKER_STATE.labels(self.state.value).set(0)
            metrics.WORKER_STATE.labels(state.value).set(1)
            self.state = state

    # -- shutdown -------------------------------------------------------------------------

    async def _drain(self, duties: list[asyncio.Task]) -> int:
        """Draining: finish what runs until the deadline, release the rest, flush, deregister."""
        self._set_state(State.DRAINING)
        self._draining = True
        self.heartbeater.beat_soon()
        running = [a.runner for a in self._inflight.values() if a.runner and not a.runner.done()]
        if running and self.settings.drain_seconds > 0:
            # All attempts finishing, a second signal, or the drain deadline: whichever is first.
            finished = asyncio.create_task(asyncio.wait(running))
            hurry = asyncio.create_task(self._hurry.wait())
            await asyncio.wait([finished, hurry], timeout=self.settings.drain_seconds,
                               return_when=asyncio.FIRST_COMPLETED)
            finished.cancel()
            hurry.cancel()
        unfinished = [a for a in self._inflight.values() if not a.reporting]
        for attempt in unfinished:
            self._abandon(attempt)
        ok = await self._retry_until(RELEASE_TIMEOUT, "release", lambda: self._release(unfinished))
        ok = await self._retry_until(RELEASE_TIMEOUT, "flush", self._flush_all) and ok
        for duty in duties:
            duty.cancel()
        await asyncio.gather(*duties, return_exceptions=True)
        ok = await self._retry_until(RELEASE_TIMEOUT, "deregister", lambda: self._duty_conn.fetch(
            sql.DEREGISTER_WORKER, {"worker": self.identity.id})) and ok
        log.info("worker stopped", extra={"released": len(unfinished), "clean": ok})
        return 0 if ok else 1

    async def _release(self, attempts: list[Attempt]) -> None:
        if not attempts:
            return
        rows = await self._claim_conn.fetch(sql.RELEASE, {"ids": [a.id for a in attempts],
                                                          "tokens": [a.token for a in attempts]})
        released = {row[0] for row in rows}
        for attempt in attempts:
            self._inflight.pop(attempt.id, None)
            if attempt.id in released:
                metrics.TASKS_RELEASED.labels(attempt.queue).inc()
        log.info("released %d leases back to pending (attempts not consumed)", len(released),
                 extra={"task_ids": sorted(released)})

    async def _flush_all(self) -> None:
        while self.completer.buffered:
            await self.completer.flush()

    async def _retry_until(self, seconds: float, what: str, step: Any) -> bool:
        deadline = time.monotonic() + seconds
        failures = 0
        while True:
            try:
                await step()
                return True
            except psycopg.Error as exc:
                failures += 1
                metrics.DB_ERRORS.labels(what).inc()
                if time.monotonic() >= deadline:
                    log.error("shutdown %s failed, leases will expire and be rescued: %s", what, exc)
                    return False
                await asyncio.sleep(error_wait(failures, cap=1.0))


class _SchemaMissing(Exception):
    pass


def _encode_result(result: Any) -> str:
    try:
        return json.dumps(result)
    except (TypeError, ValueError) as exc:
        raise PermanentError(f"handler returned a value that is not JSON-serialisable: {exc}") from None
