"""Helpers for tests that run real worker processes against a real Postgres."""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

FAST_LEASES = ["--lease-seconds", "3", "--heartbeat-seconds", "1"]


class WorkerProcess:
    """A `queueworker worker` child process with its log in a temp file."""

    def __init__(self, dsn: str, *args: str, env: dict[str, str] | None = None, builtin_tasks: bool = True):
        self.log_path = Path(tempfile.mkstemp(prefix="qw-worker-", suffix=".log")[1])
        self._log = open(self.log_path, "wb")
        # The URL goes by environment, as in a pod: on the command line any local user could read it.
        # Most tests run the built-in qw.* tasks, which production workers leave out unless told.
        builtin = {"QUEUEWORKER_BUILTIN_TASKS": "true"} if builtin_tasks else {}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "queueworker.cli", "worker", "--log-format", "text", *args],
            stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, "DATABASE_URL": dsn, **builtin, **(env or {})})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.flush()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


def builtin_registry() -> Any:
    """A registry of the test's own holding the built-in qw.* tasks (a worker adds them to the
    default registry only, and only when told)."""
    from queueworker.runtime.builtin_tasks import register_builtin_tasks
    from queueworker.runtime.handlers import Registry

    registry = Registry()
    register_builtin_tasks(registry)
    return registry


async def run_worker_until(worker: Any, done: Callable[[], bool], timeout: float = 30.0) -> int:
    """Runs an in-process queueworker.runtime.worker.Worker until `done()` (checked in a thread) holds, then
    stops it; its exit code."""
    running = asyncio.create_task(worker.run())
    deadline = time.monotonic() + timeout
    while not running.done() and not await asyncio.to_thread(done):
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)
    if not running.done():
        worker.request_stop()
    return await running


class _Deadline:
    """The one polling loop's bookkeeping, shared by `wait_until` and `until`: a condition is
    looked at until it returns something true or `timeout` seconds have passed; the failure says
    what was awaited and the last value seen."""

    def __init__(self, timeout: float, message: str):
        self._timeout = timeout
        self._message = message
        self._ends = time.monotonic() + timeout

    def reached(self, value: Any) -> bool:
        if value:
            return True
        if time.monotonic() > self._ends:
            raise AssertionError(f"timed out after {self._timeout:g}s waiting for {self._message} (last value {value!r})")
        return False


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1,
               message: str = "condition") -> Any:
    """Calls `predicate` every `interval` seconds until it returns something true, and returns that;
    fails after `timeout` seconds naming `message` and the last value."""
    deadline = _Deadline(timeout, message)
    while not deadline.reached(value := predicate()):
        time.sleep(interval)
    return value


# The superuser's connections that `query` keeps between calls, by thread and URL, until the test
# ends (`close_kept_connections`): tests poll with `query` (`wait_until`), and a new login costs
# the server and the client together about 17 ms of CPU (SCRAM). Any other role's connections are
# opened for each call, since a test may be trying that role's login itself. A kept connection
# prepares nothing (a test may change the schema between two polls) and holds no lock, no
# transaction and no session setting between calls.
_kept: dict[tuple[int, str], psycopg.Connection] = {}


def query(dsn: str, statement: str, params: Any = None) -> list[tuple]:
    key = (threading.get_ident(), dsn)
    conn = _kept.get(key)
    if conn is not None and _ended(conn):
        conn.close()
        del _kept[key]
        conn = None
    if conn is None:
        conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None)
        if conn.info.parameter_status("is_superuser") != "on":
            with conn:
                return conn.execute(statement, params).fetchall()
        _kept[key] = conn
        return conn.execute(statement, params).fetchall()
    try:
        return conn.execute(statement, params).fetchall()
    except psycopg.OperationalError:
        if not conn.broken:
            raise
        # Its server ended it after `_ended` looked: a connection made now is what the call would
        # have had without keeping one.
        del _kept[key]
        return query(dsn, statement, params)


def _ended(conn: psycopg.Connection) -> bool:
    """Whether the server ended a kept connection (its database dropped, the server stopped): an
    idle connection hears nothing otherwise, bar a reported setting that changed, which is then
    not worth keeping it for either."""
    return conn.closed or bool(select.select([conn.fileno()], [], [], 0)[0])


# The superuser's connections to the server's maintenance database that create and drop each test's
# database (tests/conftest.py), kept by thread for the whole session: two logins fewer per test, about
# 2,000 a run.
_admin: dict[tuple[int, str], psycopg.Connection] = {}


def admin_execute(admin_dsn: str, statement: str) -> None:
    """Runs `statement` (a CREATE or DROP DATABASE) on this thread's kept connection to `admin_dsn`,
    logging in again when the server ended it (a restart)."""
    key = (threading.get_ident(), admin_dsn)
    conn = _admin.get(key)
    if conn is not None and _ended(conn):
        conn.close()
        conn = None
    if conn is None:
        conn = _admin[key] = psycopg.connect(admin_dsn, autocommit=True, prepare_threshold=None)
    try:
        conn.execute(statement)
    except psycopg.OperationalError:
        if not conn.broken:
            raise
        del _admin[key]
        admin_execute(admin_dsn, statement)


def close_kept_connections() -> None:
    """Closes the connections `query` kept (tests/conftest.py: before a test's database is dropped,
    and at each test's end)."""
    while _kept:
        _kept.popitem()[1].close()


def numbered(text: str) -> tuple[str, list[str]]:
    """A statement's text with `$n` for each named placeholder (numbered by first use, as psycopg
    does), and the names in that order: the text a server-side prepared statement is made from."""
    names: list[str] = []

    def number(match: re.Match) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"
    return re.sub(r"%\((\w+)\)s", number, text), names


def scalar(dsn: str, statement: str, params: Any = None) -> Any:
    return query(dsn, statement, params)[0][0]


def state_counts(dsn: str) -> dict[str, int]:
    return dict(query(dsn, "SELECT state::text, count(*) FROM queueworker.tasks GROUP BY state"))


def assert_each_succeeded_once(dsn: str, ids: list[int]) -> None:
    rows = query(dsn, """
        SELECT t.id, t.state::text,
               (SELECT count(*) FROM queueworker.task_events e WHERE e.task_id = t.id AND e.to_state = 'succeeded')
        FROM queueworker.tasks t WHERE t.id = ANY(%s)""", (ids,))
    assert len(rows) == len(ids)
    bad = [r for r in rows if r[1] != "succeeded" or r[2] != 1]
    assert not bad, f"{len(bad)} tasks not succeeded exactly once, e.g. {bad[:5]}"


def worker_id_of(dsn: str, pid: int) -> str | None:
    rows = query(dsn, "SELECT id::text FROM queueworker.workers WHERE pid = %s", (pid,))
    return rows[0][0] if rows else None


class FreezableProxy:
    """A TCP proxy to Postgres that can go silent: `freeze()` stops relaying in both directions
    while keeping every connection open (packets are accepted, nothing is delivered), which is
    how a network partition or a hung server looks from the client; `thaw()` resumes. New
    connections made while frozen hang too. Gives one process an unreachable database while
    every other process still reaches it."""

    def __init__(self, target_host: str, target_port: int):
        import socket
        import threading

        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._running = threading.Event()
        self._running.set()
        self._closed = False
        self._sockets: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    @classmethod
    def in_front_of(cls, dsn: str) -> "FreezableProxy":
        """A proxy to the server `dsn` points at."""
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        return cls(params.get("host") or "127.0.0.1", int(params.get("port") or 5432))

    def dsn_for(self, dsn: str) -> str:
        return psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=str(self.port))

    def freeze(self) -> None:
        self._running.clear()

    def thaw(self) -> None:
        self._running.set()

    def close(self) -> None:
        self._closed = True
        self._running.set()
        for sock in [self._listener, *self._sockets]:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        import socket
        import threading

        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._running.wait()
            try:
                server = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._relay, args=(source, sink), daemon=True).start()

    def _relay(self, source, sink) -> None:
        while not self._closed:
            try:
                data = source.recv(65536)
            except OSError:
                break
            if not data:
                break
            self._running.wait()
            try:
                sink.sendall(data)
            except OSError:
                break
        for sock in (source, sink):
            try:
                sock.shutdown(2)
            except OSError:
                pass


class WatchedDuty:
    """A background duty of an in-process Worker, watched through the worker's signals (watch it
    before the worker runs): the delay each pass returned, and whether the duty sleeps, so a test
    can let it settle into a wait and then see the pass that something (a notification) caused.
    `name` is the duty's (as the worker's log lines say it), `wake` the event that wakes it."""

    def __init__(self, worker: Any, name: str, wake: asyncio.Event):
        self._name = name
        self._wake = wake
        self.started = 0
        self.delays: list[float | None] = []
        self._running = False
        worker.signals.duty_started.watch(self._started)
        worker.signals.duty_ended.watch(self._ended)

    def _started(self, duty: str) -> None:
        if duty == self._name:
            self.started += 1
            self._running = True

    def _ended(self, ended: Any) -> None:
        if ended.duty == self._name:
            self._running = False
            if not ended.failed:
                self.delays.append(ended.delay)

    async def asleep_after(self, started: int, timeout: float = 60.0) -> int:
        """Waits until a pass begun after the first `started` ones has ended and nothing has woken
        the duty since; returns how many passes have ended."""
        await until(lambda: self.started > started and not self._running and not self._wake.is_set(), timeout,
                     "the duty to settle into a wait")
        return len(self.delays)

    async def next_delay(self, ended: int, timeout: float = 60.0) -> float | None:
        """The delay returned by the first pass to end after the first `ended` ones."""
        await until(lambda: len(self.delays) > ended, timeout, "the duty's next pass")
        return self.delays[ended]


async def until(condition: Callable[[], Any], timeout: float = 30.0, message: str = "condition",
                interval: float = 0.02) -> Any:
    """`wait_until` for a coroutine: `condition` may return an awaitable (an `async` lambda's
    coroutine, `asyncio.to_thread(...)`), which is awaited; the event loop runs between looks."""
    deadline = _Deadline(timeout, message)
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if deadline.reached(value):
            return value
        await asyncio.sleep(interval)


async def start_listening(worker: Any, *watched: WatchedDuty) -> asyncio.Task:
    """Runs an in-process Worker until its listener listens and each watched duty has settled into
    a wait after the look that listening starts with (so that a later pass has another cause);
    returns the task running it."""
    marks: list[list[int]] = []
    # The worker's `listening` signal comes once LISTEN is in place, after the catch-up.
    worker.signals.listening.watch(lambda _: marks.append([duty.started for duty in watched]))
    running = asyncio.create_task(worker.run())
    await until(lambda: bool(marks) or running.done(), 60, "the listener to listen")
    assert not running.done() and not worker.listener.polling
    for duty, started in zip(watched, marks[0]):
        await duty.asleep_after(started)
    return running
