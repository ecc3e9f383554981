"""Tracing (queueworker.tracing, the `otel` extra): the producer's trace context travels in the task's
headers, each attempt runs in a CONSUMER span under it, and the handler's spans nest in the attempt's."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import ValidationError

from queueworker import enqueue, enqueue_many, tracing
from queueworker.cli import main as cli_main
from queueworker.runtime.handlers import Continue, PermanentError, Registry
from queueworker.client.producer import MAX_HEADERS, MAX_HEADERS_BYTES, TaskSpec, enqueue_chain, start_run
from queueworker.settings import WorkerSettings
from queueworker.runtime.worker import Worker
from tests import otel
from tests.support import query, run_worker_until, scalar

FAST = WorkerSettings(concurrency=4, lease_seconds=3, heartbeat_seconds=1, drain_seconds=1,
                      scheduler_max_interval_seconds=0.5, retry_base_seconds=0.1, retry_max_seconds=0.2)
TRACER = trace.get_tracer("tests")


@pytest.fixture
def finished_spans():
    yield from otel.recording()


def _finished(dsn: str, ids: list[int]) -> bool:
    return scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE id = ANY(%s) "
                       "AND state IN ('succeeded', 'failed')", (ids,)) == len(ids)


def _traceparent(context: trace.SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def _registry() -> Registry:
    registry = Registry()

    def sync_inner(payload, ctx):
        with TRACER.start_as_current_span("inner sync"):
            return "sync"

    async def async_inner(payload, ctx):
        await asyncio.sleep(0)
        with TRACER.start_as_current_span("inner async"):
            return "async"

    def flaky(payload):
        raise RuntimeError("always")

    def permanent(payload):
        raise PermanentError("never")

    def paged(payload):
        return Continue({"page": 1}) if payload["page"] == 0 else "last page"

    for name, fn in [("t.sync", sync_inner), ("t.async", async_inner), ("t.flaky", flaky),
                     ("t.permanent", permanent), ("t.paged", paged), ("t.untraced", permanent)]:
        registry.register(fn, name)
    return registry


@pytest.mark.integration
def test_attempts_continue_the_producers_trace_with_their_outcomes(dsn, finished_spans):
    with psycopg.connect(dsn, autocommit=True) as conn:
        untraced = enqueue(conn, "t.untraced")
    with psycopg.connect(dsn, autocommit=True) as conn, TRACER.start_as_current_span("request") as request:
        ids = dict(zip(["t.sync", "t.async", "t.flaky", "t.permanent", "t.paged"], enqueue_many(conn, [
            {"task": "t.sync"}, {"task": "t.async"}, {"task": "t.flaky", "max_attempts": 2},
            {"task": "t.permanent"}, {"task": "t.paged", "payload": {"page": 0}}])))
    producer = request.get_span_context()

    def pages() -> list[int]:
        return [row[0] for row in query(dsn, "SELECT id FROM queueworker.tasks WHERE task = 't.paged'")]

    assert asyncio.run(run_worker_until(Worker(dsn, FAST, _registry()),
                                        lambda: len(pages()) == 2 and _finished(dsn, list({untraced, *ids.values(), *pages()})))) == 0

    attempts = finished_spans("queueworker.run ")
    by_task: dict[str, list] = {}
    for span in sorted(attempts, key=lambda s: s.attributes["queueworker.task.attempt"]):
        by_task.setdefault(span.attributes["queueworker.task.name"], []).append(span)
    (root,) = by_task.pop("t.untraced")  # no headers: a trace of its own
    assert root.parent is None and root.context.trace_id != producer.trace_id
    assert root.attributes["queueworker.task.outcome"] == "failed"
    attempts.remove(root)
    for span in attempts:
        assert span.kind is SpanKind.CONSUMER
        assert span.context.trace_id == producer.trace_id, span.name
        assert span.attributes["messaging.destination.name"] == "default"
        assert span.attributes["messaging.system"] == "queueworker"
    for name in ("t.sync", "t.async", "t.flaky", "t.permanent"):
        for span in by_task[name]:
            assert span.parent.span_id == producer.span_id, f"{name}: a child of the producer's span"
            assert span.attributes["queueworker.task.id"] == ids[name]
            assert span.name == f"queueworker.run {name}"

    (sync,), (async_,) = by_task["t.sync"], by_task["t.async"]
    for span in (sync, async_):
        assert span.attributes["queueworker.task.outcome"] == "succeeded"
        assert "error.type" not in span.attributes and span.status.status_code is StatusCode.UNSET
    (inner_sync,), (inner_async,) = finished_spans("inner sync"), finished_spans("inner async")
    assert inner_sync.parent.span_id == sync.context.span_id, "the sync handler's span nests in its attempt's"
    assert inner_async.parent.span_id == async_.context.span_id, "the async handler's span nests in its attempt's"

    first, second = by_task["t.flaky"]  # the retry kept the headers: its parent is the producer's span too
    assert [first.attributes["queueworker.task.attempt"], second.attributes["queueworker.task.attempt"]] == [1, 2]
    assert [first.attributes["queueworker.task.outcome"], second.attributes["queueworker.task.outcome"]] == \
        ["retrying", "failed"]
    for span in (first, second):
        assert span.attributes["error.type"] == "RuntimeError" and span.status.status_code is StatusCode.ERROR
    (permanent,) = by_task["t.permanent"]
    assert permanent.attributes["queueworker.task.outcome"] == "failed"
    assert permanent.attributes["error.type"] == "PermanentError"

    # A Continue's next page is enqueued under the attempt that returned it.
    page_0, page_1 = by_task["t.paged"][0], next(s for s in by_task["t.paged"] if s is not by_task["t.paged"][0])
    assert page_0.parent.span_id == producer.span_id and page_0.attributes["queueworker.task.outcome"] == "continued"
    assert page_1.parent.span_id == page_0.context.span_id
    assert page_1.attributes["queueworker.task.outcome"] == "succeeded"

    # The headers moved with the rows into the finished partition.
    stored = dict(query(dsn, "SELECT id, headers ->> 'traceparent' FROM queueworker.tasks_finished "
                             "WHERE id = ANY(%s)", (list(ids.values()),)))
    assert stored == {task_id: _traceparent(producer) for task_id in ids.values()}


@pytest.mark.integration
def test_every_enqueue_path_stores_the_trace_context_and_explicit_headers_win(dsn, finished_spans):
    with psycopg.connect(dsn, autocommit=True) as conn:
        untraced = enqueue(conn, "t.sync")
        with TRACER.start_as_current_span("request") as request:
            plain = enqueue(conn, "t.sync")
            unique = enqueue(conn, "t.sync", dedupe_key="k")
            (chained, after) = enqueue_chain(conn, [{"task": "t.sync"}, {"task": "t.sync"}])
            run = start_run(conn, "r", [{"task": "t.sync"}])
            mine = enqueue(conn, "t.sync", headers={"traceparent": "mine", "tenant": "a"})
        bare = enqueue(conn, "t.sync", headers={"tenant": "b"})
    traceparent = _traceparent(request.get_span_context())
    (partition,) = [row[0] for row in query(dsn, "SELECT id FROM queueworker.tasks WHERE run_id = %s", (run,))]
    headers = dict(query(dsn, "SELECT id, headers FROM queueworker.tasks"))
    assert headers[untraced] is None
    for task_id in (plain, unique, chained, after, partition):
        assert headers[task_id] == {"traceparent": traceparent}, task_id
    assert headers[mine] == {"traceparent": "mine", "tenant": "a"}
    assert headers[bare] == {"tenant": "b"}


@pytest.mark.integration
def test_the_cli_takes_headers(dsn, capsys):
    assert cli_main(["enqueue", "-q", "t.sync", "--dsn", dsn, "--header", "traceparent=00-abc", "--header",
                     "tenant=a=b"]) == 0
    task_id = int(capsys.readouterr().out)
    assert scalar(dsn, "SELECT headers FROM queueworker.tasks WHERE id = %s", (task_id,)) == \
        {"traceparent": "00-abc", "tenant": "a=b"}
    with pytest.raises(SystemExit) as refused:
        cli_main(["enqueue", "t.sync", "--dsn", dsn, "--header", "no-equals-sign"])
    assert refused.value.code == 2
    assert "--header" in capsys.readouterr().err
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks") == 1


@pytest.mark.parametrize(("headers", "message"), [
    ({"a": 1}, "string"),
    ({"a": "x\x00y"}, "printable"),
    ({"": "x"}, "at least 1 character"),
    ({"a": "x" * 1025}, "at most 1024 characters"),
    ({f"h{i}": "x" for i in range(MAX_HEADERS + 1)}, f"at most {MAX_HEADERS} items"),
    ({f"h{i}": "x" * 1000 for i in range(10)}, f"more than {MAX_HEADERS_BYTES} bytes"),
    (["traceparent", "x"], "valid dictionary"),
], ids=["number", "nul", "empty-name", "long-value", "too-many", "too-big", "not-an-object"])
def test_bad_headers_are_refused_with_the_rule(headers, message):
    with pytest.raises(ValidationError, match=message) as refused:
        TaskSpec(task="t", headers=headers)
    assert refused.value.errors()[0]["loc"][0] == "headers"


def test_a_tick_of_the_controller_is_a_span_with_its_decision(finished_spans):
    from queueworker.scaling.policy import QueueDepth
    from tests.test_controller_reconcile import FakeKube, tick

    kube = FakeKube()
    kube.secret = "postgresql://app:hunter2hunter2@db/app"
    tick(kube, QueueDepth(ready=7, running=1))
    (span,) = finished_spans("queueworker.reconcile")
    assert dict(span.attributes) == {"k8s.namespace.name": "ns", "queueworker.queueworker.name": "w",
                                     "queueworker.decision": "Activated", "queueworker.replicas.current": 0,
                                     "queueworker.replicas.desired": 4}
    kube.secret = None
    tick(kube, QueueDepth(ready=7, running=1))
    assert finished_spans("queueworker.reconcile")[-1].attributes["queueworker.decision"] == "HoldingOnError"
    tick(kube, QueueDepth(ready=7, running=1), spec={"queue": "jobs"})  # a tick that fails: _failed
    assert finished_spans("queueworker.reconcile")[-1].attributes["queueworker.decision"] == "InvalidSpec"
    assert not any("hunter2" in str(value) for s in finished_spans() for value in s.attributes.values())


BLOCK_OPENTELEMETRY = """
class NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"blocked: {name}")
sys.meta_path.insert(0, NoOpenTelemetry())
"""


@pytest.mark.integration
@pytest.mark.parametrize(("setup", "check"), [
    (BLOCK_OPENTELEMETRY, 'tracing.TRACER is None and "opentelemetry" not in sys.modules'),
    ("", 'tracing.TRACER is not None and not tracing.sdk_configured()'),
], ids=["not-installed", "api-without-sdk"])
def test_without_opentelemetry_or_an_sdk_tasks_run_and_keep_their_headers(dsn, setup, check):
    """In a process of its own: the extra not installed (opentelemetry cannot be imported at all), or
    the API installed and no SDK set up. The worker starts no span, and a next page keeps the task's
    headers."""
    program = "import sys\n" + setup + textwrap.dedent("""
        import asyncio
        import psycopg
        from queueworker import enqueue, tracing
        from queueworker.runtime.handlers import Continue, Registry
        from queueworker.runtime.worker import Worker
        from tests.support import run_worker_until, scalar
        from queueworker.settings import WorkerSettings
        assert eval(sys.argv[2])
        dsn = sys.argv[1]
        registry = Registry()
        registry.register(lambda payload: Continue({"n": 1}) if payload.get("n") is None else payload, "t.paged")
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueue(conn, "t.paged", headers={"tenant": "a"})
        done = lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == 2
        fast = WorkerSettings(lease_seconds=3, heartbeat_seconds=1, drain_seconds=1)
        assert asyncio.run(run_worker_until(Worker(dsn, fast, registry), done)) == 0
        print(scalar(dsn, "SELECT json_agg(headers ORDER BY id)::text FROM queueworker.tasks"))
        assert eval(sys.argv[2])
    """)
    result = subprocess.run([sys.executable, "-c", program, dsn, check], capture_output=True, text=True, timeout=120,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [{"tenant": "a"}, {"tenant": "a"}], "the next page kept the task's headers"


@pytest.mark.integration
def test_headers_nested_too_deeply_for_python_leave_the_task_to_run_once(dsn, finished_spans):
    """Stored by hand (the API refuses them): 3,000 levels, which jsonb keeps and json.loads cannot
    read. With tracing on, the attempt runs and succeeds at once, in a root span, instead of dying
    before it starts, unobserved, until its lease is fenced."""
    deep = "[" * 3000 + "]" * 3000
    task_id = scalar(dsn, "INSERT INTO queueworker.tasks (queue, task, headers) VALUES ('default', 't.sync', "
                          "jsonb_build_object('traceparent', %s::jsonb)) RETURNING id", (deep,))
    assert asyncio.run(run_worker_until(Worker(dsn, FAST, _registry()), lambda: _finished(dsn, [task_id]))) == 0
    assert query(dsn, "SELECT state::text, attempts FROM queueworker.tasks WHERE id = %s", (task_id,)) == \
        [("succeeded", 1)]
    (span,) = finished_spans("queueworker.run ")
    assert span.parent is None


def test_stored_headers_that_are_not_an_object_of_strings_count_as_none():
    assert tracing._stored_headers("[" * 3000 + "]" * 3000) == {}
    assert tracing._stored_headers(None) == {}
    assert tracing._stored_headers("[1]") == {}
    assert tracing._stored_headers('{"traceparent": 5, "tenant": "a"}') == {"tenant": "a"}
