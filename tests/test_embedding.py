"""A worker run inside an application (docs/embedding.md): the exported `Worker`, `run_worker` and
`run_worker_async`, with the application's own registry, loop and signal handlers (integration
tier: real Postgres; the signal test is a real process of its own)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading

import psycopg
import pytest

import queueworker
from queueworker import Registry, WorkerSettings, enqueue_many
from tests.support import state_counts, until, wait_until

pytestmark = pytest.mark.integration

SETTINGS = WorkerSettings(concurrency=4, drain_seconds=5, lease_seconds=5)


def test_an_asyncio_application_runs_a_worker_with_its_own_registry_and_keeps_its_signals(dsn):
    registry = Registry()
    handled: list[int] = []

    @registry.task(name="app.add")
    async def add(payload, ctx):
        handled.append(payload["n"])
        return {"sum": payload["n"] + 1}

    events: list[str] = []

    async def application() -> int:
        loop = asyncio.get_running_loop()
        app_stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGUSR1, app_stop.set)  # the application's own handler
        ready = asyncio.Event()

        def on_ready(worker):
            events.append(f"ready:{worker.ready}")
            ready.set()

        async def on_stopped(worker, code):
            events.append(f"stopped:{code}")

        worker = queueworker.Worker(dsn, SETTINGS, registry, on_ready=on_ready, on_stopped=on_stopped)
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(ready.wait(), 30)
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueue_many(conn, [{"task": "app.add", "payload": {"n": n}} for n in range(20)])
        await until(lambda: len(handled) >= 20, 60, "the 20 tasks to be handled", interval=0.05)
        worker.request_stop()
        code = await asyncio.wait_for(running, 30)
        # The worker never touched the application's signals: SIGTERM is still the default action,
        # and the application's SIGUSR1 handler still works.
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        os.kill(os.getpid(), signal.SIGUSR1)
        await asyncio.wait_for(app_stop.wait(), 10)
        loop.remove_signal_handler(signal.SIGUSR1)
        return code

    assert asyncio.run(application()) == 0
    assert sorted(handled) == list(range(20))
    assert events == ["ready:True", "stopped:0"]
    assert state_counts(dsn) == {"succeeded": 20}
    with psycopg.connect(dsn) as conn:  # drained and deregistered
        assert conn.execute("SELECT count(*) FROM queueworker.workers").fetchone()[0] == 0


def test_a_stop_requested_before_run_returns_at_once_and_a_worker_runs_only_once(dsn):
    worker = queueworker.Worker(dsn, SETTINGS, Registry())
    worker.request_stop()
    assert asyncio.run(asyncio.wait_for(worker.run(), 10)) == 0
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM queueworker.workers").fetchone()[0] == 0
    with pytest.raises(RuntimeError, match="runs once"):
        asyncio.run(worker.run())


def test_run_worker_in_a_thread_is_stopped_from_another_thread(dsn):
    """The sync form on a thread of its own (signals can only be handled on the main thread, so
    it is told not to), stopped from the main thread: the stop crosses threads safely."""
    registry = Registry()
    started = threading.Event()

    @registry.task(name="app.wait")
    def wait(payload, ctx):  # a sync handler, running while the stop comes
        started.set()
        ctx.cancelled.wait(0.5)

    workers: list[queueworker.Worker] = []
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(queueworker.run_worker(
        dsn, SETTINGS, registry, install_signal_handlers=False, on_ready=workers.append)))
    thread.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [{"task": "app.wait"}])
    assert started.wait(30)
    workers[0].request_stop()
    thread.join(30)
    assert not thread.is_alive() and codes == [0]
    assert state_counts(dsn) == {"succeeded": 1}  # the drain let it finish


def test_handlers_modules_cannot_go_with_a_registry_of_ones_own(dsn):
    with pytest.raises(ValueError, match="registry of your own"):
        queueworker.run_worker(dsn, SETTINGS, Registry(), handlers=["tests.example_handlers"])


APPLICATION = textwrap.dedent("""
    import asyncio, signal, sys
    import queueworker

    registry = queueworker.Registry()

    @registry.task(name="app.slow")
    async def slow(payload, ctx):
        print("started", flush=True)
        await asyncio.sleep(1)

    async def main():
        stopped = []
        def on_ready(worker):
            # The application owns SIGTERM: it stops its own work, and the worker with it.
            asyncio.get_running_loop().add_signal_handler(
                signal.SIGTERM, lambda: (print("application got SIGTERM", flush=True), worker.request_stop()))
            print("ready", flush=True)
        code = await queueworker.run_worker_async(
            sys.argv[1], queueworker.WorkerSettings(concurrency=2, drain_seconds=10), registry,
            on_ready=on_ready, on_stopped=lambda worker, code: stopped.append(code))
        print(f"worker exited {code}, stopped hook {stopped}", flush=True)
        return code

    sys.exit(asyncio.run(main()))
""")


def test_an_application_process_forwards_its_sigterm_and_the_worker_drains(dsn, tmp_path):
    """A real process: the application's SIGTERM handler stops the embedded worker, which lets
    the running task finish before it exits 0."""
    script = tmp_path / "app.py"
    script.write_text(APPLICATION)
    proc = subprocess.Popen([sys.executable, str(script), dsn], stdout=subprocess.PIPE, text=True,
                            cwd=os.getcwd())
    try:
        assert proc.stdout.readline().strip() == "ready"
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueue_many(conn, [{"task": "app.slow"}, {"task": "app.slow"}])
        assert proc.stdout.readline().strip() == "started"
        wait_until(lambda: state_counts(dsn).get("running") == 2, message="both tasks running")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert "application got SIGTERM" in out
    assert "worker exited 0, stopped hook [0]" in out
    assert proc.returncode == 0
    assert state_counts(dsn) == {"succeeded": 2}


def test_the_cli_finds_handler_modules_in_the_working_directory(dsn, tmp_path):
    package = tmp_path / "app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(textwrap.dedent("""
        from queueworker import task

        @task(name="app.hello")
        def hello(payload, ctx):
            return {"hello": payload["name"]}
    """))
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [{"task": "app.hello", "payload": {"name": "x"}}])
    cli = os.path.join(os.path.dirname(sys.executable), "queueworker")  # the console script, as users run it
    proc = subprocess.Popen([cli, "worker", "--handlers", "app.tasks", "--log-format", "text"], cwd=tmp_path,
                            env={**os.environ, "DATABASE_URL": dsn, "PYTHONPATH": ""},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: state_counts(dsn) == {"succeeded": 1} or proc.poll() is not None,
                   message="the task handled")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert state_counts(dsn) == {"succeeded": 1}


@pytest.mark.parametrize("module, message", [
    ("os", "handler module 'os' registers no task handlers"),
    ("no_such_module_here", "cannot import handler module 'no_such_module_here'"),
])
def test_the_cli_refuses_a_handler_module_that_registers_nothing(dsn, module, message):
    proc = subprocess.run([sys.executable, "-m", "queueworker.cli", "worker", "--handlers", module],
                          env={**os.environ, "DATABASE_URL": dsn}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
