"""Unit: both log formats redact passwords wherever they appear in a record."""

from __future__ import annotations

import io
import json
import logging
import os
import pty
import re
from collections import Counter

import psycopg
import pytest

from queueworker import enqueue
from queueworker.logs import configure_logging, default_format
from tests.support import WorkerProcess, wait_until

PASSWORD = "Pa55-w0rd_x"
URL = f"postgresql://app:{PASSWORD}@db.example:5432/app"
TOKEN = "tok_5f3a9c0e1d2b"  # a secret that is not recognisably a URL: masked only because it is configured


@pytest.fixture
def captured():
    """What the root logger writes, once configure_logging has installed its handler."""
    stream = io.StringIO()
    yield stream
    logging.getLogger().handlers[:] = []


def _configure(stream: io.StringIO, *args, **kwargs) -> None:
    configure_logging(*args, **kwargs)
    logging.getLogger().handlers[0].setStream(stream)


def _log_everything() -> None:
    log = logging.getLogger("app")
    log.warning("connecting to %s", URL, extra={"dsn": URL, "conninfo": f"host=db password={PASSWORD}",
                                               "nested": {"urls": [URL], "token": TOKEN}, "count": 3})
    log.error("plain message with %s and %s", TOKEN, ("tuple", URL))
    try:
        raise RuntimeError(f"cannot connect with {URL} (token {TOKEN})")
    except RuntimeError:
        log.exception("failed")
    log.warning("stack", stack_info=True, extra={"why": URL})


@pytest.mark.parametrize("json_format", [True, False])
def test_no_password_or_configured_secret_reaches_the_log(captured, json_format):
    _configure(captured, "DEBUG", json_format, secrets=[TOKEN, PASSWORD])
    _log_everything()
    output = captured.getvalue()
    assert PASSWORD not in output and TOKEN not in output
    assert "app:***@db.example" in output and "cannot connect with" in output


def test_json_lines_keep_their_fields_and_types(captured):
    _configure(captured, "INFO", True, secrets=[PASSWORD])
    _log_everything()
    first, second, third, _ = (json.loads(line) for line in captured.getvalue().splitlines())
    assert first["msg"] == "connecting to postgresql://app:***@db.example:5432/app"
    assert first["dsn"] == "postgresql://app:***@db.example:5432/app" and first["count"] == 3
    assert first["conninfo"] == "host=db password=***"
    assert first["nested"]["urls"] == ["postgresql://app:***@db.example:5432/app"]
    assert third["level"] == "error" and "RuntimeError: cannot connect with postgresql://app:***@" in third["exc"]


def test_url_passwords_are_redacted_even_with_no_secret_configured(captured):
    _configure(captured, "INFO", False)
    logging.getLogger("app").warning("retrying %s", URL)
    assert captured.getvalue()[9:] == "WARNING app: retrying postgresql://app:***@db.example:5432/app\n"


def test_a_short_password_inside_names_leaves_them_readable(captured):
    _configure(captured, "INFO", True, secrets=["bench"])
    logging.getLogger("app").warning("task %s finished in %s", "bench_sleep", "queueworker_bench",
                                     extra={"dsn": "postgresql://u:bench@db/queueworker_bench"})
    line = json.loads(captured.getvalue())
    assert line["msg"] == "task bench_sleep finished in queueworker_bench"
    assert line["dsn"] == "postgresql://u:***@db/queueworker_bench"


def test_text_lines_keep_the_fields_of_the_json_lines(captured):
    _configure(captured, "info", json_format=False)
    logging.getLogger("queueworker.worker").info("worker starting", extra={"queues": ["a", "b"], "concurrency": 10})
    line = captured.getvalue().strip()
    assert re.fullmatch(r'\d\d:\d\d:\d\d INFO queueworker\.worker: worker starting queues=\["a", "b"\] concurrency=10',
                        line), line


def test_text_on_a_terminal_json_elsewhere():
    primary, secondary = pty.openpty()
    try:
        with os.fdopen(secondary, "w", closefd=False) as terminal:
            assert default_format(terminal) == "text"
    finally:
        os.close(primary)
        os.close(secondary)
    assert default_format(io.StringIO()) == "json"
    closed = io.StringIO()
    closed.close()
    assert default_format(closed) == "json"


SUMMARY = re.compile(r"INFO queueworker\.worker: last 1s: ([\d,]+) tasks finished \(([^)]*)\); \d+ running of 10")


def _summarised(log: str) -> Counter:
    """Outcomes over every summary line (the tasks may finish across two intervals)."""
    outcomes: Counter = Counter()
    for total, detail in SUMMARY.findall(log):
        parts = dict(reversed(part.split(" ")) for part in detail.split(", "))
        assert sum(int(n) for n in parts.values()) == int(total)
        outcomes.update({label: int(n) for label, n in parts.items()})
    return outcomes


@pytest.mark.integration
def test_a_worker_logs_each_finished_task_at_debug_and_a_summary_at_info(dsn):
    worker = WorkerProcess(dsn, "--log-level", "debug", "--summary-interval-seconds", "1")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            ids = [enqueue(conn, "qw.noop") for _ in range(3)]
            failing = enqueue(conn, "qw.fail", {"message": "boom"}, max_attempts=1)
        wait_until(lambda: _summarised(worker.log()) == {"succeeded": 3, "failed": 1}, message="the summary lines")
    finally:
        worker.stop()
    log = worker.log()
    for task_id in ids:
        assert re.search(rf"DEBUG queueworker\.worker: task {task_id} qw\.noop: succeeded after [\d.]+s "
                         rf"task_id={task_id}", log), log
    assert f"task {failing} qw.fail: failed after" in log
