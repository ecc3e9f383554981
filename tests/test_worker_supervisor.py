"""`queueworker worker --processes N`: one supervisor, N real worker processes, real signals and
kills (integration tier)."""

from __future__ import annotations

import os
import signal

import psutil
import psycopg
import pytest

from queueworker.client.producer import enqueue_many
from queueworker.runtime.processes import metrics_ports
from tests.support import WorkerProcess, query, scalar, state_counts, wait_until

pytestmark = pytest.mark.integration


def _enqueue(dsn: str, count: int, seconds: float) -> None:
    with psycopg.connect(dsn) as conn:
        enqueue_many(conn, [{"task": "qw.sleep", "payload": {"seconds": seconds}}] * count)


def _worker_pids(dsn: str) -> set[int]:
    return {pid for pid, in query(dsn, "SELECT pid FROM queueworker.workers")}


@pytest.fixture
def supervisor():
    started: list[WorkerProcess] = []

    def start(dsn: str, *args: str) -> WorkerProcess:
        proc = WorkerProcess(dsn, "--lease-seconds", "6", *args)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        children = psutil.Process(proc.pid).children() if proc.proc.poll() is None else []
        proc.stop()
        for child in children:
            child.kill()


def test_n_processes_share_the_queue_and_one_sigterm_drains_them_all(dsn, supervisor):
    proc = supervisor(dsn, "--processes", "3", "--concurrency", "4")
    wait_until(lambda: len(_worker_pids(dsn)) == 3, message="three workers registered")
    children = {child.pid for child in psutil.Process(proc.pid).children()}
    assert _worker_pids(dsn) == children  # the workers are the supervisor's own children
    _enqueue(dsn, 300, 0.01)
    wait_until(lambda: state_counts(dsn) == {"succeeded": 300}, timeout=60, message="all done")
    claimed_by = query(dsn, "SELECT count(DISTINCT worker) FROM queueworker.task_events "
                            "WHERE to_state = 'running'")[0][0]
    assert claimed_by >= 2  # the work was shared, not done by one of them
    _enqueue(dsn, 6, 2.0)  # running when the stop comes: the drain lets them finish
    wait_until(lambda: state_counts(dsn).get("running") == 6, message="six running")
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.log()
    assert state_counts(dsn) == {"succeeded": 306}
    assert scalar(dsn, "SELECT count(*) FROM queueworker.workers") == 0
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in children)


def test_a_killed_worker_is_started_again_and_the_supervisor_still_stops_clean(dsn, supervisor):
    proc = supervisor(dsn, "--processes", "2")
    wait_until(lambda: len(_worker_pids(dsn)) == 2, message="two workers registered")
    victim = min(_worker_pids(dsn))
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: victim not in {c.pid for c in psutil.Process(proc.pid).children()}
               and len(psutil.Process(proc.pid).children()) == 2, message="a new worker process")
    wait_until(lambda: len(_worker_pids(dsn) - {victim}) == 2, message="the new worker registered")
    assert "ended on its own (exit -9)" in proc.log()
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.log()


def test_a_killed_supervisor_leaves_no_worker_behind(dsn, supervisor):
    proc = supervisor(dsn, "--processes", "2")
    wait_until(lambda: len(_worker_pids(dsn)) == 2, message="two workers registered")
    children = [psutil.Process(pid) for pid in _worker_pids(dsn)]
    _enqueue(dsn, 2, 1.0)
    proc.signal(signal.SIGKILL)
    # The kernel sends each worker SIGTERM: they drain, deregister and exit.
    wait_until(lambda: not any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE
                               for child in children), timeout=30, message="the workers gone")
    assert scalar(dsn, "SELECT count(*) FROM queueworker.workers") == 0
    assert state_counts(dsn).get("running", 0) == 0


def test_arguments_every_worker_refuses_stop_the_supervisor_with_exit_2(dsn, supervisor):
    proc = supervisor(dsn, "--processes", "2", "--handlers", "os")
    assert proc.wait(60) == 2, proc.log()
    assert "registers no task handlers" in proc.log()


def test_each_worker_gets_a_metrics_port_of_its_own_or_any_free_one(dsn, supervisor):
    assert metrics_ports(9100, 3) == [9100, 9101, 9102] and metrics_ports(None, 2) == [None, None]
    with pytest.raises(ValueError, match="--metrics-port 65534 with 3 processes needs ports 65534-65536"):
        metrics_ports(65534, 3)
    proc = supervisor(dsn, "--processes", "2", "--metrics-port", "0")
    children = wait_until(lambda: (lambda c: len(c) == 2 and c)(psutil.Process(proc.pid).children()),
                          message="two worker processes")
    # The last --metrics-port of each worker's command line is the one it serves on.
    ports = [[value for flag, value in zip(c.cmdline(), c.cmdline()[1:]) if flag == "--metrics-port"][-1]
             for c in children]
    assert ports == ["0", "0"], "port 0 means any free port, for each worker"
