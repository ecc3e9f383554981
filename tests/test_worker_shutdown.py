"""Stopping a worker: a graceful stop records or releases every task it claimed, and the whole
shutdown fits its budget even when the database hangs (integration tier, real processes)."""

from __future__ import annotations

import random
import signal
import threading
import time

import psycopg
import pytest

from queueworker.client.producer import enqueue_many
from tests.support import FreezableProxy, WorkerProcess, scalar, state_counts, wait_until

pytestmark = pytest.mark.integration

SLOW_SUCCESS_WRITES = """
CREATE FUNCTION public.slow_success_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(0.01 + random() * 0.04);
    RETURN NULL;
END $$;
CREATE TRIGGER slow_success_write AFTER INSERT ON queueworker.tasks_finished
    FOR EACH STATEMENT EXECUTE FUNCTION public.slow_success_write();
"""


class SteadyProducer:
    """Enqueues qw.noop tasks at a steady rate from a thread until stopped."""

    def __init__(self, dsn: str, per_second: int = 300, batch: int = 10):
        self._dsn, self._interval, self._batch = dsn, batch / per_second, batch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SteadyProducer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            while not self._stop.wait(self._interval):
                enqueue_many(conn, [{"task": "qw.noop"}] * self._batch)


def test_a_graceful_stop_never_leaves_a_task_running(dsn):
    """Success writes slowed by 10-50 ms, a steady feed, SIGTERM mid-stream: every stop must end
    with each claimed task recorded or released (none left `running` for the rescuer), exit 0."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SLOW_SUCCESS_WRITES)
    with SteadyProducer(dsn):
        for _ in range(5):
            proc = WorkerProcess(dsn, "--concurrency", "32", "--drain-seconds", "3")
            try:
                wait_until(lambda: state_counts(dsn).get("succeeded", 0) > 0, message="worker started working")
                time.sleep(random.uniform(5, 6))
                proc.signal(signal.SIGTERM)
                code = proc.wait(30)
                running = scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'running'")
                assert (code, running) == (0, 0), \
                    f"exit {code} with {running} tasks left running:\n{proc.log()[-3000:]}"
            finally:
                proc.stop()


def test_shutdown_fits_its_budget_even_when_the_database_hangs(dsn):
    """The database stops answering (packets accepted, nothing delivered): the drain, the release
    and the flush share one budget (drain 2 s + 5 s by default), and the worker says it was not clean."""
    ids = _enqueue_sleeps(dsn, 2, seconds=60)
    proxy = FreezableProxy.in_front_of(dsn)
    proc = WorkerProcess(proxy.dsn_for(dsn), "--concurrency", "2", "--drain-seconds", "2")
    try:
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'running' "
                                       "AND id = ANY(%s)", (ids,)) == 2, message="both tasks running")
        proxy.freeze()
        stopped = time.monotonic()
        proc.signal(signal.SIGTERM)
        code = proc.wait(30)
        took = time.monotonic() - stopped
        assert code == 1, proc.log()[-3000:]
        assert took < 7 + 3, f"shutdown took {took:.1f}s against a budget of 7 s\n" + proc.log()[-3000:]
        assert "within the shutdown budget" in proc.log()
    finally:
        proc.stop()
        proxy.close()


def _enqueue_sleeps(dsn: str, count: int, seconds: float) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return enqueue_many(conn, [{"task": "qw.sleep", "payload": {"seconds": seconds}}] * count)
