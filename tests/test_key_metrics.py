"""The top keys as Prometheus series (`--key-metrics N`, queueworker.runtime.key_metrics): none by
default; with N, the N keys of each keyed queue with the most tasks ready, and a key that leaves
the top N loses its series."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from queueworker import enqueue_many
from queueworker import metrics
from queueworker.client import operations
from queueworker.db.keys import KeyReportRow
from queueworker.dev.localpg import free_port
from queueworker.runtime.key_metrics import KeyMetrics
from tests.support import WorkerProcess, wait_until
from tests.test_key_limits import keyed


def key_series(port: int) -> dict[tuple[str, str, str], float] | None:
    """The worker's queueworker_key_tasks series, (queue, key, state) -> value; None before it serves."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except urllib.error.URLError:
        return None
    return {(s.labels["queue"], s.labels["key"], s.labels["state"]): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "queueworker_key_tasks"}


def metric_names(port: int) -> set[str]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {family.name for family in text_string_to_metric_families(text)}


@pytest.mark.integration
def test_a_worker_exports_the_top_keys_only_when_asked(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, keyed("tenants", {"a": 5, None: 4, "b": 3, "c": 1}))
        operations.pause(conn, "tenants")  # the tasks stay ready while the worker runs
    asked, plain = free_port(), free_port()
    workers = [WorkerProcess(dsn, "--queue", "tenants", "--key-metrics", "2", "--metrics-port", str(asked),
                             "--metrics-address", "127.0.0.1"),
               WorkerProcess(dsn, "--queue", "tenants", "--metrics-port", str(plain), "--metrics-address", "127.0.0.1")]
    try:
        series = wait_until(lambda: key_series(asked), timeout=30, message="the top keys' series")
        assert series == {("tenants", "a", "ready"): 5, ("tenants", "a", "running"): 0,
                          ("tenants", "", "ready"): 4, ("tenants", "", "running"): 0}
        assert wait_until(lambda: key_series(plain) is not None and metric_names(plain), message="the other's metrics")
        assert key_series(plain) == {}, "no series per key unless asked for"
    finally:
        for worker in workers:
            worker.stop()


class FakeConnection:
    """Answers KEY_REPORT with the rows given for each queue."""

    def __init__(self, rows: dict[str, list[tuple[str | None, int, int]]]):
        self.rows = rows

    async def fetch(self, statement, params):
        return [KeyReportRow(key, ready, 0, 0, running, None, None, None, None, None, False, None, None, None, 0,
                             None, None, 0, 0, 0) for key, ready, running in self.rows[params.queue][:params.limit]]


def test_a_key_that_leaves_the_top_loses_its_series_and_keys_without_tasks_have_none():
    conn = FakeConnection({"q1": [("a", 9, 1), ("b", 5, 0)], "q2": [(None, 2, 2), ("idle", 0, 0)]})
    duty = KeyMetrics(conn, lambda: {"q1", "q2"}, top=2)  # type: ignore[arg-type]

    def exported() -> set[tuple[str, str]]:
        return {(s.labels["queue"], s.labels["key"]) for f in metrics.KEY_TASKS.collect() for s in f.samples
                if s.labels["queue"] in ("q1", "q2")}
    asyncio.run(duty.step())
    assert exported() == {("q1", "a"), ("q1", "b"), ("q2", "")}
    conn.rows["q1"] = [("c", 12, 0), ("a", 9, 1)]
    asyncio.run(duty.step())
    assert exported() == {("q1", "c"), ("q1", "a"), ("q2", "")}
    assert metrics.KEY_TASKS.labels("q1", "a", "running")._value.get() == 1
