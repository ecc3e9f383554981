"""The worker process: the lease loop of docs/state-machine.md.

The fetch loop claims pending tasks in batches sized by free slots and hands each attempt to
its handler (worker/runtime/processing.py); the completer flushes outcomes in batches; the
heartbeater keeps leases alive and fences attempts whose lease passed by its own clock; the
rescuer, scheduler, cron duty and cleaner run the queue's background duties; the listener wakes
the fetch loop (or polls, where LISTEN does not work). Every duty runs under the same supervisor
(worker/runtime/supervisor.py): no error ends it. On a stop request (SIGTERM/SIGINT when it owns
the signals) the worker drains within one shutdown budget (worker/runtime/shutdown.py): stop
claiming, let attempts finish until the drain deadline, cancel the rest and hand their leases back
without consuming an attempt, flush every outcome, deregister. `Worker.signals`
(worker/runtime/signals.py) tells tests and applications what it does, as it does it.

`Worker`, `run_worker` and `run_worker_async` are the public way to run one, inside an application
as well as from the CLI (which uses `run_worker`): docs/embedding.md.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from .. import dsn as dsn_text
from .. import metrics, tracing
from ..backoff import backoff
from ..client.cron import Schedule, default_schedule
from ..db.connection import DutyConnection
from ..db.lease import (ASYNC_COMMIT_CLAIMS, DEREGISTER_WORKER, RELEASE, SAVE_CHECKPOINT, ClaimParams,
                        DeregisterWorkerParams, KeyClaimParams, SaveCheckpointParams)
from ..db.migrate import latest_version, migrate
from ..db.migration import SCHEMA_EXISTS, SCHEMA_VERSION
from ..db.statements import NO_PARAMS, Statement
from ..events import DueTimer, wait_event
from ..settings import WorkerSettings
from .attempt import Attempt
from .builtin_tasks import register_builtin_tasks
from .cancels import CancelChecks
from .cleaner import Cleaner
from .key_metrics import KeyMetrics
from .completer import BACKLOG_RESULT_BYTES, Completer
from .cron import CronDuty
from .flow import FlowControl
from .handlers import CANCELLED, LEASE_LOST, SHUTDOWN, HandlerThreads, Registry, TaskContext, default_registry
from .heartbeat import Heartbeater, WorkerIdentity
from .listener import Listener
from .processing import AttemptProcessor
from .rescuer import Rescuer
from .scheduler import Scheduler
from .shutdown import run_to_exit, sever, stop_fetching, within_budget
from .signals import WorkerSignals
from .supervisor import ErrorStreak, supervise
from .watchdog import LoopWatchdog

log = logging.getLogger("queueworker.worker")
task_log = logging.getLogger("queueworker.task")

# Consecutive claim failures that are not database hiccups (a bug, a missing grant) after which the
# worker stops: it cannot take work, so it must not pretend to (its pod restarts and says why).
CLAIM_FAILURES_BEFORE_EXIT = 5
# Stop signal to exit: time kept back from the drain for releasing, flushing and deregistering.
SHUTDOWN_RESERVE_SECONDS = 3.0
EXIT_UNCLEAN = 1
# The database connections one worker process holds at most, whatever it does: Worker._connections(),
# the duty connection, which also listens, and the outcome connection (docs/architecture.md, "Two
# connections per worker process"). The controller scales within the database's connection budget
# with it (docs/controller.md, "The database's connection budget").
CONNECTIONS_PER_WORKER = 2


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


# Hooks an application may give a worker: each is called with the worker (and `on_stopped` with its
# exit code too); a coroutine function is awaited on the worker's loop.
ReadyHook = Callable[["Worker"], Any]
StoppedHook = Callable[["Worker", int], Any]


class Worker:
    """One worker: claims tasks from `settings.queues` and runs them with the handlers of `registry`.

    Run it once, with `await worker.run()` (or `run_worker`/`run_worker_async`). `request_stop()`
    drains it from anywhere, at any time: before `run()` (which then returns at once), from the
    worker's loop, or from another thread. Signals are left alone unless `install_signal_handlers`
    is true, as in the CLI: then SIGTERM/SIGINT drain it, and the loop's handlers for them are
    removed again when it stops. `on_ready` is called once the worker is registered, has
    recovered expired leases and claims; `on_stopped` once it has drained and deregistered.
    With the default registry (that `@task` fills) come the schedules that `periodic` and
    `@task(cron=...)` declare; with a registry of its own, only those of `schedule`. `signals`
    (queueworker.runtime.signals) tells whoever watches of its claims, wake-ups, duty passes and
    notifications, as they happen.
    """

    def __init__(self, dsn: str, settings: WorkerSettings | None = None, registry: Registry | None = None,
                 auto_migrate: bool = False, *, install_signal_handlers: bool = False,
                 on_ready: ReadyHook | None = None, on_stopped: StoppedHook | None = None,
                 schedule: Schedule | None = None):
        dsn_text.validate(dsn)  # a malformed URL cannot heal: refuse it before anything starts
        settings = settings if settings is not None else WorkerSettings()
        registry = default_registry if registry is None else registry
        if schedule is None and registry is default_registry:
            schedule = default_schedule
        self.settings = settings
        self.registry = registry
        if settings.builtin_tasks:
            if registry is not default_registry:  # an embedder's registry holds what it registers, nothing else
                raise ValueError("builtin_tasks adds the qw.* tasks to the default registry only: call "
                                 "register_builtin_tasks(registry) on a registry of your own")
            register_builtin_tasks(registry)
        self.identity = WorkerIdentity.for_this_process(settings.queues, settings.concurrency)
        self._dsn = dsn
        self._auto_migrate = auto_migrate
        prepare = settings.prepare_statements
        # Claims, heartbeats and the housekeeping duties; the listener waits on it for notifications
        # whenever none of them needs it.
        self._duty_conn = DutyConnection(dsn, "queueworker-duty", prepare=prepare)
        # What attempts write: completions, checkpoints, the release at shutdown. Apart from the
        # claims, so that flushing outcomes and claiming overlap.
        self._outcome_conn = DutyConnection(dsn, "queueworker-outcome", prepare=prepare)
        self._checkpoint_saver = self._save_checkpoint  # one bound method for every attempt
        self._inflight: dict[tuple[int, int], Attempt] = {}
        self._threads = HandlerThreads()
        self.state = State.STARTUP
        self._exit_code = 0
        self._stopping = False
        self._stop_started = 0.0
        self._draining = False
        # Events bind to a loop only when first waited on: made here, so a stop may come before run().
        self._stop_requested = asyncio.Event()
        self._hurry = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._install_signal_handlers = install_signal_handlers
        self._on_ready = on_ready
        self._on_stopped = on_stopped
        self.ready = False
        self.signals = WorkerSignals()
        self._claim_errors = ErrorStreak("claim", log, dsn)
        self._finished: Counter[str] = Counter()  # outcomes written since the last summary line
        self.scheduler = Scheduler(self._duty_conn, settings.scheduler_max_interval_seconds)
        self._due_timer = DueTimer(self.scheduler.poke)  # a pass when tasks announced for later are due
        self._token_timer = DueTimer(self._wakeup.set)  # a claim again when a bucket that cut one short refills
        self._probe_timer = DueTimer(self._wakeup.set)  # a claim when a breaker's cooldown ends (its probe)
        self.flow = FlowControl(self._duty_conn, settings.queues, on_change=lambda: self._wake_at(0.0),
                                on_probe_due=self._probe_timer.at)
        self.completer = Completer(self._outcome_conn, settings.flush_interval_seconds, settings.flush_max_batch,
                                   self._flushed, on_waiting=self.scheduler.poke,
                                   unknown_task_grace_seconds=settings.unknown_task_grace_seconds,
                                   signals=self.signals, flow=self.flow)
        # Handlers may put the worker's own connection string in an error message: never store it.
        self._processor = AttemptProcessor(registry, self._threads, self.completer, settings,
                                           (dsn, dsn_text.parse(dsn).get("password")), self._slot_freed)
        # Heartbeats go on the duty connection: a slow or blocked flush must never hold back the beat that
        # keeps every lease alive. When a claim or a duty holds that connection, the outcome connection
        # takes the beat if it is free (a heartbeat meeting a row a flush just moved is re-run: met_moved_row).
        self.heartbeater = Heartbeater((self._duty_conn, self._outcome_conn), self.identity, settings.heartbeat_seconds,
                                       settings.lease_seconds, lambda: list(self._inflight.values()),
                                       lambda: self._draining, self._can_claim, self._leases_lost)
        self.rescuer = Rescuer(self._duty_conn, settings.rescue_interval_seconds,
                               settings.deadline_grace_seconds, settings.worker_ttl_seconds)
        self.cleaner = Cleaner(self._duty_conn, settings.retention_seconds, settings.watermark_retention_seconds,
                               settings.cleaner_interval_seconds)
        self.cron = CronDuty(self._duty_conn, schedule or Schedule(), listening=lambda: not self.listener.polling)
        self.key_metrics = KeyMetrics(self._duty_conn, lambda: self.flow.keyed, settings.key_metrics)
        self.cancels = CancelChecks(self._duty_conn, self._runs, self._running_keys, self._cancelled_task)
        self.listener = Listener(dsn, self._duty_conn, self._outcome_conn, settings.queues, self._wake_at,
                                 str(self.identity.id), self.cancels.hint, self.flow.settings_changed,
                                 self.cron.changed, catch_up=self._catch_up, signals=self.signals,
                                 listen=settings.listen, poll_interval=settings.poll_interval_seconds)

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self) -> int:
        """Runs until stopped; returns the exit code: 0 after a clean drain, non-zero if a task
        could not be recorded or released, or the worker stopped itself (it says why in its log)."""
        if self._started:
            raise RuntimeError("a Worker runs once: make a new one to run again")
        self._started = True
        self._loop = loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT) if self._install_signal_handlers else ()
        for sig in signals:
            loop.add_signal_handler(sig, self.request_stop)
        try:
            exit_code = await self._run(loop)
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
        await self._call_hook("on_stopped", self._on_stopped, self, exit_code)
        return exit_code

    async def _run(self, loop: asyncio.AbstractEventLoop) -> int:
        watchdog = LoopWatchdog(loop)
        watchdog.start()
        log.info("worker starting", extra={"worker_id": str(self.identity.id), "queues": list(self.settings.queues),
                                           "concurrency": self.settings.concurrency,
                                           "database": dsn_text.describe(self._dsn),
                                           "tasks": self.registry.names()})
        duties: list[asyncio.Task] = []
        try:
            if not await self._connect():
                return self._exit_code
            self._set_state(State.RECOVERY)
            await self._recover_at_start()
            fetch = asyncio.create_task(self._fetch_loop(), name="fetch")  # first: its claim goes out first
            duties = [asyncio.create_task(supervise(name, step, log, self.signals, dsn=self._dsn, **options),
                                          name=name) for name, step, options in self._duties()]
            self.ready = True
            await self._call_hook("on_ready", self._on_ready, self)
            stop = asyncio.create_task(self._stop_requested.wait())
            done, _ = await asyncio.wait([stop, fetch, *duties], return_when=asyncio.FIRST_COMPLETED)
            for ended in done - {stop}:
                if not self._stopping:
                    # Loops never end on their own (the supervisor keeps them going); if one does,
                    # the worker cannot be trusted to do its job: stop, cleanly, and say so.
                    log.critical("%s loop ended unexpectedly: stopping the worker", ended.get_name(),
                                 exc_info=None if ended.cancelled() else ended.exception())
                    self.request_stop(EXIT_UNCLEAN)
            stop.cancel()
            return await self._drain(fetch, duties)
        finally:
            watchdog.stop()
            self._due_timer.cancel()
            self._token_timer.cancel()
            self._probe_timer.cancel()
            for duty in duties:
                duty.cancel()
            await asyncio.gather(*duties, return_exceptions=True)
            for conn in self._connections():
                await conn.close()
            self.ready = False
            self._set_state(State.STOPPED)

    async def _call_hook(self, name: str, hook: Callable[..., Any] | None, *args: Any) -> None:
        """An application's hook: its errors are logged, never allowed to stop or break the worker."""
        if hook is None:
            return
        try:
            outcome = hook(*args)
            if asyncio.iscoroutine(outcome) or isinstance(outcome, asyncio.Future):
                await outcome
        except Exception:  # noqa: BLE001 - application code: logged, the worker goes on
            log.exception("the worker's %s hook raised", name)

    def _connections(self) -> tuple[DutyConnection, ...]:
        return self._duty_conn, self._outcome_conn

    def _duties(self) -> list[tuple[str, Callable[[], Awaitable[float | None]], dict[str, Any]]]:
        """(name, step, supervise() options) of every background duty."""
        duties = [
            ("listen", self.listener.step, {}),
            # A failed heartbeat is retried within a second: the fence cancels attempts whose lease
            # runs out, and a database that came back must get its heartbeat before that.
            ("heartbeat", self.heartbeater.step, {"wake": self.heartbeater.now, "error_cap_seconds": 1.0,
                                                  "first_delay": self.settings.heartbeat_seconds}),
            ("fence", self._fence_step, {"first_delay": 1.0}),
            ("rescue", self.rescuer.step, {"first_delay": self.settings.rescue_interval_seconds, "jitter": 0.2}),
            ("schedule", self.scheduler.step, {"wake": self.scheduler.poked}),
            ("complete", self.completer.step, {"wake": self.completer.pending, "first_delay": None}),
            ("flow", self.flow.step, {"wake": self.flow.wake}),
            ("cancel", self.cancels.step, {"wake": self.cancels.wake, "first_delay": None}),
            # No jitter: the cron duty sleeps until a slot, the same moment for every worker, and
            # the compare-and-set decides which of them enqueues it.
            ("cron", self.cron.step, {"wake": self.cron.wake}),
        ]
        duties.append(("summary", self._summary_step, {"first_delay": self.settings.summary_interval_seconds}))
        if self.settings.retention_seconds or self.settings.watermark_retention_seconds:
            duties.append(("clean", self.cleaner.step, {"first_delay": self.settings.cleaner_interval_seconds,
                                                        "jitter": 0.2}))
        if self.settings.key_metrics:
            duties.append(("key-metrics", self.key_metrics.step, {"first_delay": 1.0, "jitter": 0.2}))
        return duties

    def request_stop(self, exit_code: int = 0) -> None:
        """First call: drain. Second call: shorten the drain to zero. Safe from any thread, and
        before `run()` (which then returns at once) or after it (nothing left to do)."""
        loop = self._loop
        if loop is not None and loop.is_running() and not _running_here(loop):
            loop.call_soon_threadsafe(self._stop, exit_code)
        else:
            self._stop(exit_code)

    def _stop(self, exit_code: int) -> None:
        self._exit_code = max(self._exit_code, exit_code)
        if self._stopping:
            log.warning("second stop request: cancelling remaining attempts now")
            self._hurry.set()
            return
        log.info("stop requested: draining", extra={"drain_seconds": self.settings.drain_seconds,
                                                    "shutdown_seconds": self.settings.shutdown_seconds})
        self._stopping = True
        self._stop_started = time.monotonic()
        self._stop_requested.set()
        self._wakeup.set()
        self._slot_freed.set()

    async def _connect(self) -> bool:
        """Connecting: register the worker row once the schema is there. False if stopped first."""
        self._set_state(State.CONNECTING)
        errors = ErrorStreak("connect", log, self._dsn, cap_seconds=30.0, expected=(SchemaNotReady,),
                             failed="cannot start")
        while not self._stopping:
            try:
                if self._auto_migrate:
                    await asyncio.to_thread(migrate, self._dsn)
                await self._open_connections()
                await self._check_schema()
                await self.heartbeater.register()
                return True
            except Exception as exc:  # noqa: BLE001 - start-up keeps trying; every error is logged
                wait = errors.record(exc)
                self._set_state(State.ERROR_WAIT)
                await self._sleep_unless_stopped(wait)
                self._set_state(State.CONNECTING)
        return False

    async def _open_connections(self) -> None:
        """Opens both connections together: one after the other, their handshakes would add up
        before the first task starts. Raises the first failure once every attempt has ended (none
        is left connecting behind)."""
        outcomes = await asyncio.gather(*(conn.open() for conn in self._connections()), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _check_schema(self) -> None:
        exists = (await self._duty_conn.fetch(SCHEMA_EXISTS, NO_PARAMS))[0].exists
        version = (await self._duty_conn.fetch(SCHEMA_VERSION, NO_PARAMS))[0].version if exists else 0
        if version < latest_version():
            raise SchemaNotReady(f"database schema is at version {version}, this worker needs "
                                 f"{latest_version()}: run `queueworker migrate` (or start the worker with --migrate)")

    async def _recover_at_start(self) -> None:
        try:
            await self.rescuer.rescue_once()
        except Exception as exc:  # noqa: BLE001 - the rescue duty retries it shortly
            ErrorStreak("rescue", log, self._dsn).record(exc)

    # -- fetch loop -----------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        idle_polls = 0
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
                self._claim_errors.succeeded()
            except Exception as exc:  # noqa: BLE001 - supervised: logged, counted, ErrorWait
                wait = self._claim_errors.record(exc)
                self._set_state(State.ERROR_WAIT)
                if self._claim_errors.unexpected >= CLAIM_FAILURES_BEFORE_EXIT:
                    log.critical("claiming failed %d times in a row for reasons that do not heal: stopping "
                                 "the worker", self._claim_errors.unexpected)
                    self.request_stop(EXIT_UNCLEAN)
                    return
                await self._sleep_unless_woken(wait)
                continue
            if claimed:
                idle_polls = 0
                if claimed == free:
                    continue  # full batch: there may be more, claim again as soon as slots free up
            self._set_state(State.BACKOFF)
            idle_polls += 1
            interval = backoff(idle_polls - 1, self.settings.poll_min_seconds, self.settings.poll_max_seconds)
            self._set_state(State.IDLE)
            await self._sleep_unless_woken(interval)

    def _can_claim(self) -> bool:
        """False while claims fail for reasons that do not heal: such a worker must not heartbeat."""
        return self._claim_errors.unexpected == 0

    def _free_slots(self) -> int:
        """Handlers that may start now. A finished handler frees its slot at once, so the next
        claim overlaps the flush of its outcome. Outcomes waiting for a flush are bounded too, so a
        slow database stops claims instead of piling them up: by one full flush batch while their
        results are small (short tasks at low concurrency then still complete in large batches,
        not a few rows per statement), by the concurrency once they hold many result bytes."""
        running = sum(1 for attempt in self._inflight.values() if not attempt.reporting)
        waiting = len(self._inflight) - running
        backlog = self.settings.concurrency
        if self.completer.buffered_result_bytes < BACKLOG_RESULT_BYTES:
            backlog = max(backlog, self.settings.flush_max_batch)
        return min(self.settings.concurrency - running, backlog - waiting)

    def _claim_params(self, queue: str, limit: int, claim: Statement) -> ClaimParams:
        """The claim's parameters; a key-limited queue's claim passes over the keys a failure of
        which is on its way to their breaker (FlowControl.held_keys)."""
        common = dict(queue=queue, limit=limit, worker=self.identity.id, lease_seconds=self.settings.lease_seconds,
                      timeout_seconds=self.settings.task_timeout_seconds)
        if claim.params is not KeyClaimParams:
            return ClaimParams(**common)
        return KeyClaimParams(**common, held_keys=sorted(self.flow.held_keys(queue, self._inflight.values())))

    async def _claim(self, queue: str, limit: int) -> int:
        if self.flow.breaker_pending(queue, self._inflight.values()):
            return 0
        loop = asyncio.get_running_loop()
        sent_at = loop.time()  # the database starts the lease later than this: our clock is on the safe side
        first, claim = self.flow.claim_statements(queue)
        if first is None and self.settings.async_claim_commit:
            claim = ASYNC_COMMIT_CLAIMS[claim]
        self.signals.claiming.emit(queue)
        metrics.CLAIMS.labels(queue).inc()
        rows = await self._duty_conn.fetch(claim, self._claim_params(queue, limit, claim), first=first)
        now = loop.time()
        # Asked once per claim, not per row: it reads the environment (os.environ), about 5 µs a call.
        run = self._processor.traced if rows and tracing.sdk_configured() else self._processor.run
        for row in rows:
            ctx = TaskContext(row.id, row.task, row.queue, row.attempts, row.max_attempts, task_log, key=row.key)
            attempt = Attempt(row.id, row.lease_token, row.queue, row.task, row.payload_json, row.attempts,
                              row.max_attempts, now + row.seconds_to_deadline, ctx,
                              lease_expires=sent_at + self.settings.lease_seconds, run_json=row.run_json,
                              checkpoint_json=row.checkpoint_json, headers_json=row.headers_json, started=now)
            ctx.attach(self._checkpoint_saver, loop, attempt.key)
            self._inflight[attempt.key] = attempt
            attempt.runner = asyncio.create_task(run(attempt))
        if rows:
            metrics.TASKS_CLAIMED.labels(queue).inc(len(rows))
            metrics.IN_FLIGHT.set(len(self._inflight))
        self.signals.claimed.emit(rows)
        # A bucket may be what cut the claim short, or left it nothing: claim again when it has a token.
        retry_in = self.flow.next_claim_in(queue, len(rows), limit, self.settings.poll_max_seconds)
        if retry_in is not None:
            self._token_timer.at(time.time() + retry_in)
        return len(rows)

    # -- attempts -------------------------------------------------------------------------

    async def _save_checkpoint(self, key: tuple[int, int], checkpoint_json: str, progress_json: str | None) -> bool:
        """ctx.save_checkpoint's write: fenced by the attempt's lease. An attempt this worker has
        already given up on, or whose outcome is on its way, saves nothing."""
        attempt = self._inflight.get(key)
        if attempt is None:
            return False
        saved = False
        if not attempt.abandoned and not attempt.reporting:
            saved = bool(await self._outcome_conn.fetch(SAVE_CHECKPOINT, SaveCheckpointParams(
                id=attempt.id, token=attempt.token, checkpoint=checkpoint_json, progress=progress_json)))
        metrics.CHECKPOINT_WRITES.labels(attempt.queue, "saved" if saved else "refused").inc()
        return saved

    def _flushed(self, attempts: list[Attempt]) -> None:
        """Outcomes written: their slots are free for good, and there may be room under a queue's
        caps (its own, or a key's): claim now, not at the next idle poll (one claim per poll interval)."""
        self._finished.update(attempt.outcome for attempt in attempts)
        if any(attempt.queue in self.flow.capped_queues for attempt in attempts):
            self._wakeup.set()
        if log.isEnabledFor(logging.DEBUG):
            now = asyncio.get_running_loop().time()
            for attempt in attempts:
                log.debug("task %s %s: %s after %.3fs", attempt.id, attempt.task, attempt.outcome,
                          now - attempt.started, extra={"task_id": attempt.id, "queue": attempt.queue,
                                                        "attempt": attempt.attempt, "outcome": attempt.outcome})
        for attempt in attempts:
            self._forget(attempt)
        metrics.IN_FLIGHT.set(len(self._inflight))
        self._slot_freed.set()

    async def _summary_step(self) -> float:
        """The summary duty: one info line (what finished, what runs) per interval in which the
        worker did anything, so a quiet log still shows a working worker."""
        finished, self._finished = self._finished, Counter()
        running = len(self._inflight)
        if finished or running:
            total = sum(finished.values())
            detail = ", ".join(f"{count:,} {label}" for label, count in finished.most_common())
            log.info("last %gs: %s tasks finished%s; %d running of %d", self.settings.summary_interval_seconds,
                     f"{total:,}",
                     f" ({detail})" if detail else "", running, self.settings.concurrency,
                     extra={"finished": dict(finished), "running": running})
        return self.settings.summary_interval_seconds

    def _forget(self, attempt: Attempt) -> None:
        if self._inflight.get(attempt.key) is attempt:
            del self._inflight[attempt.key]

    def _leases_lost(self, attempts: list[Attempt], reason: str, stop_reason: str = LEASE_LOST) -> None:
        """The lease is gone or about to be: stop the handlers, free the slots."""
        for attempt in attempts:
            log.warning("task %s: %s: cancelling its handler", attempt.id, reason,
                        extra={"task_id": attempt.id, "lease_token": attempt.token})
            self._abandon(attempt, stop_reason)
            self._forget(attempt)
        if stop_reason == CANCELLED:
            for queue, count in Counter(attempt.queue for attempt in attempts).items():
                metrics.RUNNING_CANCELLED.labels(queue).inc(count)
        else:
            metrics.LEASES_LOST.inc(len(attempts))
        metrics.IN_FLIGHT.set(len(self._inflight))
        self._slot_freed.set()

    def _runs(self, key: tuple[int, int]) -> bool:
        """Whether this attempt's handler runs here now (its outcome not yet on its way)."""
        attempt = self._inflight.get(key)
        return attempt is not None and not attempt.reporting and not attempt.abandoned

    def _running_keys(self) -> list[tuple[int, int]]:
        return [key for key in self._inflight if self._runs(key)]

    def _cancelled_task(self, key: tuple[int, int]) -> None:
        """The database shows this attempt's task cancelled: stop its handler now."""
        if self._runs(key):
            self._leases_lost([self._inflight[key]], "the task was cancelled", CANCELLED)

    @staticmethod
    def _abandon(attempt: Attempt, reason: str) -> None:
        attempt.abandoned = True
        attempt.ctx.stop(reason)
        if attempt.runner is not None:
            attempt.runner.cancel()

    async def _fence_step(self) -> float:
        """The fence duty: cancel attempts whose lease passed by our clock; fail those whose async
        handler ignored its deadline; stop the worker when handler threads that ignore cancellation
        pile up (only a new process frees them)."""
        interval = self.heartbeater.fence()
        self._processor.fail_ignored_deadlines(self._inflight.values())
        if self._threads.stuck > self.settings.concurrency and not self._stopping:
            log.critical("%d sync handler threads ignored cancellation and still run: restarting the worker "
                         "to free them", self._threads.stuck)
            self.request_stop(EXIT_UNCLEAN)
        return interval

    # -- wake-ups -------------------------------------------------------------------------

    def _wake_at(self, due_epoch: float) -> None:
        """Due now: claim. Due later: have the scheduler admit it then; its NOTIFY wakes us all.
        One timer at most, for the earliest due time: the scheduler's pass at that moment also
        finds every later task and sleeps until the next one itself."""
        if due_epoch <= time.time():
            self._wakeup.set()
            self.signals.woken.emit(None)
            return
        self._due_timer.at(due_epoch)

    def _catch_up(self) -> None:
        """The listener (re)started listening, or polls: what it missed may be tasks due now
        (claim), tasks due later (a scheduler pass finds the earliest and sleeps until then), new
        settings or cancellations of running tasks."""
        self._wake_at(0.0)
        self.scheduler.poke()
        self.flow.settings_changed()
        self.cancels.catch_up()

    async def _sleep_unless_woken(self, seconds: float) -> None:
        await wait_event(self._wakeup, seconds)

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        await wait_event(self._stop_requested, seconds)

    def _set_state(self, state: State) -> None:
        if state is not self.state:
            metrics.WORKER_STATE.labels(self.state.value).set(0)
            metrics.WORKER_STATE.labels(state.value).set(1)
            metrics.WORKER_STATE_TRANSITIONS.labels(self.state.value, state.value).inc()
            self.state = state

    # -- shutdown -------------------------------------------------------------------------

    async def _drain(self, fetch: asyncio.Task, duties: list[asyncio.Task]) -> int:
        """Draining: finish what runs until the drain deadline, flush every outcome, hand back every
        lease still held, deregister, all within `shutdown_seconds` of the stop request. Clean only
        if every claimed task was recorded or released."""
        loop = asyncio.get_running_loop()
        budget = self.settings.shutdown_seconds
        end = loop.time() + budget - (time.monotonic() - self._stop_started)
        drain_end = min(end - min(SHUTDOWN_RESERVE_SECONDS, budget / 4),
                        loop.time() + self.settings.drain_seconds - (time.monotonic() - self._stop_started))
        self._set_state(State.DRAINING)
        self._draining = True
        self.heartbeater.beat_soon()
        clean = await stop_fetching(fetch, drain_end, self._duty_conn)
        running = [a.runner for a in self._inflight.values() if a.runner and not a.runner.done()]
        if running and drain_end > loop.time():
            # All attempts finishing, a second signal, or the drain deadline: whichever is first.
            finished = asyncio.create_task(asyncio.wait(running))
            hurry = asyncio.create_task(self._hurry.wait())
            await asyncio.wait([finished, hurry], timeout=drain_end - loop.time(), return_when=asyncio.FIRST_COMPLETED)
            finished.cancel()
            hurry.cancel()
        for attempt in [a for a in self._inflight.values() if not a.reporting]:
            self._abandon(attempt, SHUTDOWN)
        clean = await within_budget(end, "flush", self.completer.drain, self._dsn) and clean
        released = await within_budget(end, "release", self._release, self._dsn)
        clean = released and clean
        if not released:  # the database is not answering: duties must not wait on it as they stop
            await sever(self._connections())
        for duty in duties:
            duty.cancel()
        await asyncio.gather(*duties, return_exceptions=True)
        clean = await within_budget(end, "deregister", lambda timeout: self._duty_conn.execute(
            DEREGISTER_WORKER, DeregisterWorkerParams(worker=self.identity.id), timeout=timeout), self._dsn) and clean
        left = 0 if released else len(self._inflight)
        log.info("worker stopped", extra={"clean": clean, "unrecorded": left})
        if left:
            log.error("%d claimed tasks were neither recorded nor released: their leases expire and the rescuer "
                      "returns them to the queue", left)
        return max(self._exit_code, 0 if clean else EXIT_UNCLEAN)

    async def _release(self, timeout: float) -> None:
        """Hands back every task the database says this worker still holds (attempts not consumed):
        attempts the drain cut short, and any the worker no longer tracks (fenced, or claimed by a
        statement whose answer never arrived). Nothing it claimed is `running` any more after it."""
        rows = await self._outcome_conn.fetch(RELEASE, DeregisterWorkerParams(worker=self.identity.id), timeout=timeout)
        for row in rows:
            metrics.TASKS_RELEASED.labels(row.queue).inc()
        self._inflight.clear()
        metrics.IN_FLIGHT.set(0)
        log.info("released %d leases back to pending (attempts not consumed)", len(rows),
                 extra={"task_ids": sorted(row.id for row in rows)})


async def run_worker_async(dsn: str, settings: WorkerSettings | None = None, registry: Registry | None = None, *,
                           handlers: Iterable[str] = (), auto_migrate: bool = False,
                           install_signal_handlers: bool = False, on_ready: ReadyHook | None = None,
                           on_stopped: StoppedHook | None = None) -> int:
    """Runs a worker on the running loop until it is stopped; returns its exit code.

    `handlers` names modules to import first: their `@task` handlers register in the default
    registry, so they cannot go with a registry of your own (register on it instead). Inside an
    application the loop's signals stay the application's: stop the worker by calling
    `request_stop()` on the worker that `on_ready` is given (or make a `Worker` yourself). Cancelling
    the coroutine instead stops it without draining: its leases expire and the tasks run again."""
    return await _prepared(dsn, settings, registry, handlers, auto_migrate, install_signal_handlers,
                           on_ready, on_stopped).run()


def run_worker(dsn: str, settings: WorkerSettings | None = None, registry: Registry | None = None, *,
               handlers: Iterable[str] = (), auto_migrate: bool = False, install_signal_handlers: bool = True,
               on_ready: ReadyHook | None = None, on_stopped: StoppedHook | None = None) -> int:
    """Runs a worker on a loop of its own until it is stopped; returns its exit code. This is the
    program's main loop (as in the CLI), so by default SIGTERM/SIGINT drain it."""
    worker = _prepared(dsn, settings, registry, handlers, auto_migrate, install_signal_handlers,
                       on_ready, on_stopped)
    return run_to_exit(worker.run())


def _prepared(dsn: str, settings: WorkerSettings | None, registry: Registry | None, handlers: Iterable[str],
              auto_migrate: bool, install_signal_handlers: bool, on_ready: ReadyHook | None,
              on_stopped: StoppedHook | None) -> Worker:
    modules = list(handlers)
    if modules and registry is not None and registry is not default_registry:
        raise ValueError("handlers= imports modules whose @task handlers register in the default registry: "
                         "with a registry of your own, register them on it (registry.task) instead")
    default_registry.import_modules(modules)
    return Worker(dsn, settings, registry, auto_migrate, install_signal_handlers=install_signal_handlers,
                  on_ready=on_ready, on_stopped=on_stopped)


def _running_here(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether `loop` is the loop running in this thread (else it must be reached thread-safely)."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class SchemaNotReady(Exception):
    """The database schema is missing or older than this worker needs."""
