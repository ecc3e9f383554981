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


def _listening_ports(process: psutil.Process) -> set[int]:
    return {c.laddr.port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def _free_ports(count: int) -> int:
    """The first of `count` consecutive ports nothing listens on now."""
    taken = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    return next(first for first in range(20000, 60000) if not taken & set(range(first, first + count)))


@pytest.mark.parametrize("given", ["its own", "any free one"])
def test_each_worker_gets_a_metrics_port_of_its_own_or_any_free_one(dsn, supervisor, given):
    assert metrics_ports(9100, 3) == [9100, 9101, 9102] and metrics_ports(None, 2) == [None, None]
    with pytest.raises(ValueError, match="--metrics-port 65534 with 3 processes needs ports 65534-65536"):
        metrics_ports(65534, 3)
    first = _free_ports(2) if given == "its own" else 0
    proc = supervisor(dsn, "--processes", "2", "--metrics-port", str(first))
    wait_until(lambda: len(_worker_pids(dsn)) == 2, message="two workers registered")
    children = psutil.Process(proc.pid).children()
    ports = [_listening_ports(child) for child in children]
    assert all(len(own) == 1 for own in ports), ports  # each serves its metrics, on one port
    if first:
        assert sorted(port for own in ports for port in own) == [first, first + 1]
    else:
        assert len(set().union(*ports)) == 2  # port 0: any free port, a different one for each
    assert not _listening_ports(psutil.Process(proc.pid))  # the supervisor serves none


MARKING_HANDLERS = '''
import atexit, os

from queueworker import task

def _mark(what):
    with open(os.environ["QW_TEST_MARKS"], "a") as marks:
        marks.write(f"{what} {os.getpid()}\\n")

_mark("import")
atexit.register(_mark, "exit")

@task(name="mark")
def mark(payload):
    _mark("run")
'''


def test_workers_import_the_users_modules_themselves_and_run_their_exit_handlers(dsn, supervisor, tmp_path):
    """The workers are forked from a supervisor that imported the worker's own modules only: a
    handler module (which may start threads or open connections as it is imported) is imported
    by each worker, never by the supervisor, and what it registers to run at exit (a tracing SDK
    flushing its spans) runs when the worker ends, as in a process started anew."""
    (tmp_path / "marking_handlers.py").write_text(MARKING_HANDLERS)
    marks = tmp_path / "marks"
    proc = WorkerProcess(dsn, "--lease-seconds", "6", "--processes", "2", "--handlers", "marking_handlers",
                         env={"PYTHONPATH": str(tmp_path), "QW_TEST_MARKS": str(marks)})
    try:
        wait_until(lambda: len(_worker_pids(dsn)) == 2, message="two workers registered")
        workers = _worker_pids(dsn)
        with psycopg.connect(dsn) as conn:
            enqueue_many(conn, [{"task": "mark"}] * 20)
        wait_until(lambda: state_counts(dsn) == {"succeeded": 20}, message="all done")
        proc.signal(signal.SIGTERM)
        assert proc.wait(60) == 0, proc.log()
    finally:
        proc.stop()
    lines = [line.split() for line in marks.read_text().splitlines()]
    imported = [int(pid) for what, pid in lines if what == "import"]
    assert sorted(imported) == sorted(workers) and proc.pid not in imported  # once in each worker, never before
    assert {int(pid) for what, pid in lines if what == "run"} <= workers
    assert sorted(int(pid) for what, pid in lines if what == "exit") == sorted(workers)
