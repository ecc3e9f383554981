"""The console as `queueworker console` serves it (a real process, uvicorn, real Postgres): the Host
check and Secure cookies as the command line and the environment configure them, a page's memory
cost with a 60 MiB payload, and the queues page's reads on a large backlog."""

from __future__ import annotations

import contextlib
import http.client
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from queueworker import enqueue, enqueue_many
from queueworker.console import data
from queueworker.db.console import QUEUE_NAMES
from queueworker.dev.localpg import free_port
from tests.support import query, wait_until

pytestmark = pytest.mark.integration

MIB = 1024 * 1024


class Served:
    def __init__(self, port: int, process: subprocess.Popen, log: Path):
        self.port, self.process, self.log = port, process, log

    def get(self, path: str, host: str | None = None) -> tuple[int, dict[str, str], str]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.putrequest("GET", path, skip_host=True)
            connection.putheader("Host", host if host is not None else f"127.0.0.1:{self.port}")
            connection.endheaders()
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode()
        finally:
            connection.close()

    def peak_rss(self) -> int:
        """The process's high-water mark of resident memory (VmHWM), in bytes."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc")


@contextlib.contextmanager
def console(dsn: str, tmp_path: Path, *args: str, **environ: str) -> Iterator[Served]:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": dsn, **environ}
    for name in ("QUEUEWORKER_CONSOLE_TOKEN", "QUEUEWORKER_CONSOLE_TOKEN_FILE"):
        env.pop(name, None)
    log = tmp_path / f"console-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "queueworker.cli", "console", "--port", str(port), *args],
                                   env=env, stdout=out, stderr=subprocess.STDOUT)
    served = Served(port, process, log)
    try:
        def answers() -> bool:
            try:
                return served.get("/healthz")[0] == 200
            except OSError:
                assert process.poll() is None, log.read_text()
                return False

        wait_until(answers, timeout=60, message="the console answers")
        yield served
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_command_serves_only_its_hosts_and_marks_cookies_secure(dsn, tmp_path):
    with psycopg.connect(dsn, autocommit=True) as conn:
        task = enqueue(conn, "send", {"secret_of_the_page": "visible only to the console's users"}, queue="emails")
    with console(dsn, tmp_path, "--allowed-host", "console.example", "--secure-cookies",
                 QUEUEWORKER_CONSOLE_ALLOWED_HOSTS="ingress.example, other.example") as served:
        status, headers, body = served.get(f"/tasks/{task}", host="evil.example")
        assert status == 400 and body.count("\n") == 1 and "secret_of_the_page" not in body
        assert "set-cookie" not in headers and "default-src 'none'" in headers["content-security-policy"]
        for host in ("console.example", "console.example:443", "ingress.example", "other.example", "localhost:1234",
                     f"127.0.0.1:{served.port}", "10.20.30.40:8080"):
            status, headers, body = served.get(f"/tasks/{task}", host=host)
            assert status == 200 and "secret_of_the_page" in body, host
            assert "; secure" in headers["set-cookie"].lower(), host
    with console(dsn, tmp_path, QUEUEWORKER_CONSOLE_SECURE_COOKIES="true") as served:
        assert "; secure" in served.get("/queues")[1]["set-cookie"].lower()
        assert served.get("/queues", host="console.example")[0] == 400, "a name served only when given"
    with console(dsn, tmp_path) as served:
        assert "secure" not in served.get("/queues")[1]["set-cookie"].lower(), "plain HTTP on localhost"


def test_a_60_mib_payload_costs_a_page_little_memory(dsn, tmp_path):
    """Every stored value of a task is cut in Postgres: viewing a task with a 60 MiB payload (and
    large result, error, checkpoint, headers and audit detail) grows the console process's peak
    memory by far less than the payload, and the page says what was cut."""
    big = 60 * MIB
    with psycopg.connect(dsn, autocommit=True) as conn:
        small = enqueue(conn, "small", {"n": 1}, queue="emails")
        task = conn.execute(
            "INSERT INTO queueworker.tasks (queue, task, payload, result, error, checkpoint, headers) "
            "VALUES ('emails', 'huge', jsonb_build_object('blob', repeat('p', %(big)s)), "
            "jsonb_build_object('r', repeat('r', %(mib)s)), jsonb_build_object('message', repeat('e', %(mib)s)), "
            "jsonb_build_object('c', repeat('c', %(mib)s)), jsonb_build_object('h', repeat('h', %(mib)s))) "
            "RETURNING id", {"big": big, "mib": MIB}).fetchone()[0]
        conn.execute("INSERT INTO queueworker.task_events (task_id, from_state, to_state, lease_token, detail) "
                     "VALUES (%s, 'pending', 'pending', 0, jsonb_build_object('d', repeat('d', %s)))", (task, MIB))
    with console(dsn, tmp_path) as served:
        for path in (f"/tasks/{small}", "/tasks", "/queues"):  # warm: templates compiled, the pool's connection open
            assert served.get(path)[0] == 200
        before = served.peak_rss()
        status, _, page = served.get(f"/tasks/{task}")
        grown = served.peak_rss() - before
        assert status == 200 and 'id="payload"' in page
        assert grown < 16 * MIB, f"one view of the task grew the console's peak memory by {grown / MIB:.1f} MiB"
        stored = len('{"blob": ""}') + big
        assert f"Truncated, {stored} bytes: the first {data.JSON_SHOWN_CHARS} characters are shown" in page
        assert page.count("Truncated, ") == 5 and "(truncated, " in page, "result, error, checkpoint, headers, event"
        assert len(page) < 6 * data.JSON_SHOWN_CHARS + 20_000
        assert served.get("/tasks?queue=emails")[0] == 200


def test_the_queues_page_reads_each_queue_once_not_its_backlog(dsn):
    """queue_names walks the partial indexes one queue at a time: 30,000 ready, running and
    blocked tasks on three queues cost a handful of index probes, not a scan of tasks_active."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [{"task": "t", "queue": "ready-q"} for _ in range(10000)])
        conn.execute("INSERT INTO queueworker.tasks (queue, task, state) "
                     "SELECT 'blocked-q', 't', 'blocked' FROM generate_series(1, 10000)")
        conn.execute("INSERT INTO queueworker.tasks (queue, task, state, lease_owner, leased_until, deadline_at) "
                     "SELECT 'running-q', 't', 'running', gen_random_uuid(), 'infinity', 'infinity' "
                     "FROM generate_series(1, 10000)")
        conn.execute("INSERT INTO queueworker.tasks (queue, task, delayed, run_after) "
                     "VALUES ('later-q', 't', true, now() + interval '1 day')")
        conn.execute("ANALYZE queueworker.tasks_active")
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + QUEUE_NAMES.text,
                            {"limit": data.MAX_QUEUES}).fetchone()[0]
    read = _rows_read_from(plan[0]["Plan"], "tasks_active")
    assert read < 100, f"queue_names read {read} rows of tasks_active"
    names = [r[0] for r in query(dsn, QUEUE_NAMES.text, {"limit": data.MAX_QUEUES})]
    assert names == ["blocked-q", "later-q", "ready-q", "running-q"]


def _rows_read_from(node: dict, table: str) -> int:
    """Rows the scans of `table` in a plan returned, over all their loops."""
    own = node["Actual Rows"] * node["Actual Loops"] if node.get("Relation Name") == table else 0
    return own + sum(_rows_read_from(child, table) for child in node.get("Plans", []))

