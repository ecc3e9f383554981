"""Fault injection: errors in the claim path and in every duty, a worker whose database is
unreachable from it alone, a blocked event loop, sync handlers that ignore cancellation, and a
late outcome of an old attempt (integration tier: real Postgres; real processes where the
fault is the process's environment)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import signal
import time

import psycopg
import pytest

from queueworker import metrics
from queueworker.runtime.handlers import TaskContext
from queueworker.runtime.heartbeat import Heartbeater
from queueworker.runtime.attempt import Attempt
from queueworker.runtime.cleaner import Cleaner
from queueworker.client.producer import enqueue_many
from queueworker.runtime.rescuer import Rescuer
from queueworker.runtime.scheduler import Scheduler
from queueworker.settings import WorkerSettings
from queueworker.runtime.worker import CLAIM_FAILURES_BEFORE_EXIT, Worker
from tests.support import (
    FreezableProxy, WorkerProcess, builtin_registry, run_worker_until, scalar, state_counts, wait_until)

pytestmark = pytest.mark.integration

FAST = WorkerSettings(concurrency=4, lease_seconds=3, heartbeat_seconds=1, drain_seconds=1,
                      rescue_interval_seconds=0.2, cleaner_interval_seconds=0.2, scheduler_max_interval_seconds=0.5,
                      retention_seconds=3600, retry_base_seconds=0.1)


class InjectedFault(RuntimeError):
    pass


def flaky(original, failing_calls: set[int] | None = None, spy: list | None = None):
    """`original` wrapped to raise InjectedFault on the given call numbers (1-based; None: always)."""
    calls = [0]

    def should_fail() -> bool:
        calls[0] += 1
        if spy is not None:
            spy.append(time.monotonic())
        return failing_calls is None or calls[0] in failing_calls

    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def async_wrapper(*args, **kwargs):
            if should_fail():
                raise InjectedFault(f"injected fault in {original.__qualname__}")
            return await original(*args, **kwargs)
        async_wrapper.calls = calls
        return async_wrapper

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if should_fail():
            raise InjectedFault(f"injected fault in {original.__qualname__}")
        return original(*args, **kwargs)
    wrapper.calls = calls
    return wrapper


def _traceback_text(record: logging.LogRecord) -> str:
    if record.exc_info:
        return logging.Formatter().formatException(record.exc_info)
    return record.exc_text or ""


def _enqueue(dsn: str, count: int, task: str = "qw.noop", **options) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return enqueue_many(conn, [{"task": task, **options}] * count)


def _ignore(value: object) -> None:
    """A signal's watcher that does nothing: made flaky, it fails where the signal is emitted."""


# (duty label, where it goes wrong): every duty's pass, and a public method of its class (class,
# method) or one of the worker's signals emitted inside the pass, whose watcher raises.
DUTIES = [("rescue", (Rescuer, "rescue_once")), ("schedule", (Scheduler, "promote_once")),
          ("clean", (Cleaner, "clean_once")), ("heartbeat", (Heartbeater, "beat")), ("fence", (Heartbeater, "fence")),
          ("listen", "heard"), ("complete", "completing"), ("claim", "claiming")]


@pytest.mark.parametrize("duty, fault", DUTIES, ids=[d[0] for d in DUTIES])
def test_an_unexpected_error_in_any_duty_is_logged_counted_and_survived(dsn, monkeypatch, caplog, duty, fault):
    # Calls 2 and 3 fail: the first call of some duties happens at start-up, outside the duty.
    worker = Worker(dsn, FAST, builtin_registry())
    if isinstance(fault, str):
        patched = flaky(_ignore, failing_calls={2, 3})
        getattr(worker.signals, fault).watch(patched)
    else:
        owner, method = fault
        patched = flaky(getattr(owner, method), failing_calls={2, 3})
        monkeypatch.setattr(owner, method, patched)
    before = metrics.UNEXPECTED_ERRORS.labels(duty)._value.get()
    first = _enqueue(dsn, 10)

    def progressed() -> bool:
        if patched.calls[0] <= 3:
            if state_counts(dsn).get("succeeded", 0) >= 10:
                _enqueue(dsn, 5)  # keep work coming, so completions and notifications keep happening
            return False
        return state_counts(dsn).get("pending", 0) == 0 and state_counts(dsn).get("running", 0) == 0

    caplog.set_level(logging.ERROR, logger="queueworker")
    code = asyncio.run(run_worker_until(worker, progressed))
    assert code == 0
    assert metrics.UNEXPECTED_ERRORS.labels(duty)._value.get() - before == 2
    tracebacks = [r for r in caplog.records if "Traceback" in _traceback_text(r)
                  and "InjectedFault" in _traceback_text(r)]
    assert len(tracebacks) == 2, [r.getMessage() for r in caplog.records]
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE id = ANY(%s) AND state = 'succeeded'",
                  (first,)) == 10
    assert state_counts(dsn).keys() == {"succeeded"}


def test_a_worker_that_cannot_claim_stops_heartbeating_and_exits_non_zero(dsn, monkeypatch):
    claims: list[float] = []
    beats: list[float] = []
    worker = Worker(dsn, FAST, builtin_registry())
    worker.signals.claiming.watch(flaky(_ignore, None, spy=claims))
    monkeypatch.setattr(Heartbeater, "beat", flaky(Heartbeater.beat, set(), spy=beats))
    _enqueue(dsn, 3)
    started = time.monotonic()
    code = asyncio.run(run_worker_until(worker, lambda: False))
    assert code == 1
    assert len(claims) == CLAIM_FAILURES_BEFORE_EXIT
    assert not [t for t in beats if t > claims[0]], "heartbeats went on while the worker could not claim"
    assert time.monotonic() - started < 15
    assert state_counts(dsn) == {"pending": 3}
    assert scalar(dsn, "SELECT count(*) FROM queueworker.workers") == 0


def test_a_late_outcome_of_an_old_attempt_never_evicts_the_current_one(dsn):
    """A task cancelled and retried comes back to the same worker: the old attempt's outcome,
    flushed late, must leave the new attempt tracked (keyed by id and lease token)."""
    worker = Worker(dsn, FAST, builtin_registry())
    ctx = TaskContext(1, "qw.noop", "default", 1, 10, logging.getLogger("test"))
    old, new = (Attempt(1, token, "default", "qw.noop", "{}", token, 10, 0.0, ctx, lease_expires=0.0)
                for token in (1, 2))
    worker._inflight[new.key] = new
    worker._flushed([old])
    worker._leases_lost([old], "test")
    assert worker._inflight == {(1, 2): new}
    assert worker._free_slots() == FAST.concurrency - 1


def test_a_worker_cut_off_from_the_database_cancels_its_attempts_before_another_can_take_them(dsn, tmp_path):
    """Self-fencing: the database stops answering one worker only. Its attempt must be cancelled
    once its lease has run out by the worker's own clock, before the rescuer lets another worker
    start the task, so the two never run it at the same time."""
    probe = tmp_path / "probe.log"
    probe.touch()
    (task_id,) = _enqueue(dsn, 1, "probe.sleep", payload={"seconds": 60, "log": str(probe)})
    proxy = FreezableProxy.in_front_of(dsn)
    leases = ["--lease-seconds", "3", "--heartbeat-seconds", "1", "--handlers", "tests.fault_handlers"]
    cut_off = WorkerProcess(proxy.dsn_for(dsn), "--concurrency", "1", *leases)
    other = None
    try:
        wait_until(lambda: "start" in probe.read_text(), message="the task started on the first worker")
        proxy.freeze()
        frozen_at = time.time()
        other = WorkerProcess(dsn, "--concurrency", "1", *leases)
        wait_until(lambda: f"start {other.pid}" in probe.read_text(), timeout=30,
                   message="the second worker took the task over")
        events = [line.split() for line in probe.read_text().splitlines()]
        cancelled = [float(t) for event, pid, t in events if event == "cancelled" and int(pid) == cut_off.pid]
        taken_over = [float(t) for event, pid, t in events if event == "start" and int(pid) == other.pid]
        assert cancelled, f"the cut-off worker never cancelled its attempt:\n{cut_off.log()[-2000:]}"
        assert cancelled[0] < taken_over[0], "both workers ran the task at the same time"
        assert cancelled[0] - frozen_at < 3 + 1, "fenced later than about one lease after the last heartbeat"
        assert "lease ran out" in cut_off.log()
    finally:
        proxy.thaw()
        for proc in (cut_off, other):
            if proc is not None:
                proc.stop()
        proxy.close()
    assert scalar(dsn, "SELECT rescues FROM queueworker.tasks WHERE id = %s", (task_id,)) == 1


def test_a_blocked_event_loop_is_reported_with_what_blocks_it(dsn):
    _enqueue(dsn, 1, "block.loop", payload={"seconds": 2.5})
    proc = WorkerProcess(dsn, "--handlers", "tests.fault_handlers", "--metrics-port", "0")
    try:
        wait_until(lambda: state_counts(dsn).get("succeeded") == 1, timeout=30, message="blocking task done")
        wait_until(lambda: "the event loop was blocked for" in proc.log(), timeout=10, message="report")
        log = proc.log()
        assert "the event loop has not answered" in log and "block_loop" in log and "time.sleep" in log
    finally:
        proc.stop()


def test_sync_handlers_that_ignore_cancellation_do_not_starve_the_others(dsn):
    """Three handlers outlive their 1 s deadline, holding their threads; the quick tasks after them
    still start at once and get their whole deadline (none fails as DeadlineExceeded)."""
    with psycopg.connect(dsn) as conn:
        stuck = enqueue_many(conn, [{"task": "stuck.sync", "payload": {"seconds": 30}, "timeout_seconds": 1,
                                     "max_attempts": 1}] * 3)
        quick = enqueue_many(conn, [{"task": "quick.sync", "payload": {"seconds": 0.5}, "timeout_seconds": 2,
                                     "priority": -1}] * 6)
    proc = WorkerProcess(dsn, "--handlers", "tests.fault_handlers", "--concurrency", "3")
    try:
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE id = ANY(%s) AND "
                                       "state::text IN ('succeeded', 'failed')", (stuck + quick,)) == 9,
                   timeout=60, message="all tasks finished")
        assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE id = ANY(%s) AND state = 'succeeded' "
                           "AND attempts = 1", (quick,)) == 6
        assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE id = ANY(%s) AND state = 'failed' AND "
                           "error->>'type' = 'DeadlineExceeded'", (stuck,)) == 3
        wait_until(lambda: proc.log().count("its thread is stuck") == 3, timeout=10,
                   message="the three stuck threads reported, once each")
        proc.signal(signal.SIGTERM)
        assert proc.wait(30) == 0, "stuck threads must not hold up the exit"
    finally:
        proc.stop()


def test_an_async_handler_that_ignores_its_cancellation_holds_neither_its_task_nor_the_workers_exit(dsn, tmp_path):
    """A handler that catches CancelledError and goes on. Past its hard deadline it kept its task
    running (the heartbeat kept the lease) and its slot taken for good; at a stop, the worker said
    it had stopped and never exited (asyncio.run waits for every task it cancels). Now its attempt
    fails as DeadlineExceeded a grace period after the deadline, the next task gets the slot, and
    the stopped worker exits within a second of its shutdown, naming the task it left running."""
    log = tmp_path / "handler.log"
    with psycopg.connect(dsn) as conn:
        stubborn, = enqueue_many(conn, [{"task": "stubborn.async", "payload": {"log": str(log)},
                                         "timeout_seconds": 1, "max_attempts": 1}])
        quick, = enqueue_many(conn, [{"task": "quick.sync", "payload": {"seconds": 0}, "priority": -1}])
        again, = enqueue_many(conn, [{"task": "stubborn.async", "payload": {"log": str(log)},
                                      "timeout_seconds": 60, "priority": -2}])
    proc = WorkerProcess(dsn, "--handlers", "tests.fault_handlers", "--concurrency", "1", "--drain-seconds", "1")
    try:
        wait_until(lambda: scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (quick,))
                   == "succeeded", timeout=60, message="the quick task, on the slot the stubborn one held")
        assert scalar(dsn, "SELECT state::text || ' ' || (error->>'type') FROM queueworker.tasks WHERE id = %s",
                      (stubborn,)) == "failed DeadlineExceeded"
        assert "ignored a cancellation" in log.read_text(), "its deadline's cancellation was caught, not obeyed"
        wait_until(lambda: scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (again,))
                   == "running", timeout=30, message="the second stubborn task to run")
        proc.signal(signal.SIGTERM)
        assert proc.wait(30) == 0, "the stopped worker must exit"
        assert "did not end when cancelled at exit" in proc.log()
        assert "ignored the cancellation of its hard deadline" in proc.log()
        assert scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (again,)) == "pending", \
            "its lease released at the stop"
    finally:
        proc.stop()
