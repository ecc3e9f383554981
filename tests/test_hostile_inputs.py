"""Hostile inputs through real worker processes: one bad task never hurts another.

Property-based: hypothesis draws batches of results, exception messages, command outputs and
raw rows that Postgres or Python cannot take (NaN/inf, NUL, lone surrogates, deep nesting, huge
integers, large blobs, non-JSON stdout, a constraint the database enforces on results), mixed
with ordinary tasks, and runs them through one real worker process per module. Every task must
reach a terminal state, every ordinary task must succeed exactly once, the worker must keep
claiming new work, and its memory must stay bounded (integration tier).
"""

from __future__ import annotations

import json
import math
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queueworker import jsonvalue
from queueworker.db.migrate import migrate
from queueworker.client.producer import enqueue_many
from queueworker.runtime.processing import RESULT_LIMIT_BYTES
from tests.hostile_handlers import build
from tests.support import WorkerProcess, query, scalar, wait_until

pytestmark = pytest.mark.integration

COMMAND = f"hostile.cmd={sys.executable} {Path(__file__).parent / 'hostile_command.py'}"
TERMINAL = ("succeeded", "failed", "cancelled")
RSS_LIMIT_MB = 600
# Results the database refuses on its own (a constraint the test adds): Python cannot know, so
# only a write that fails row by row can single them out.
POISON_CONSTRAINT = """
ALTER TABLE queueworker.tasks_finished
    ADD CONSTRAINT no_poison CHECK (result IS NULL OR NOT (result ? 'poison'))
"""

# -- recipes: storable descriptions of hostile values (see tests/hostile_handlers.py) -----------

CODE_POINTS = st.one_of(st.sampled_from([0, 0xD800, 0xDBFF, 0xDC00, 0xDFFF, 0x5C, 0x22, 0x1F600, 0x7F]),
                        st.integers(0, 0x10FFFF))
TEXT = st.lists(CODE_POINTS, max_size=30).map(lambda points: {"str": points})
FLOATS = st.one_of(st.sampled_from(["nan", "inf", "-inf"]), st.floats(allow_nan=False, allow_infinity=False))
SCALARS = st.one_of(
    TEXT, FLOATS.map(lambda f: {"float": f}), st.integers(1, 6000).map(lambda d: {"power_of_ten": d}),
    st.integers(1, 3000).map(lambda n: {"deep": n}), st.integers(0, 200_000).map(lambda n: {"blob": n}),
    st.just({"set": []}), st.integers(-(2 ** 70), 2 ** 70), st.booleans(), st.none())
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3).map(lambda items: {"list": items}),
    st.lists(st.tuples(TEXT, inner), max_size=3).map(lambda pairs: {"dict": [list(p) for p in pairs]}),
    inner.map(lambda value: {"dict": [[{"str": [ord(c) for c in "poison"]}, value]]})), max_leaves=6)
STREAM = st.one_of(st.none(), st.lists(st.integers(0, 255), max_size=200).map(lambda b: {"bytes": b}),
                   st.tuples(st.sampled_from([0, 0x7B, 0x78]), st.integers(0, 100_000)).map(
                       lambda r: {"repeat": list(r)}))

HOSTILE_TASKS = st.one_of(
    VALUES.map(lambda v: {"task": "hostile.return", "payload": {"value": v}}),
    VALUES.map(lambda v: {"task": "hostile.return_async", "payload": {"value": v}}),
    TEXT.map(lambda t: {"task": "hostile.raise", "payload": {"message": t}}),
    st.just({"task": "hostile.unprintable"}),
    st.just({"task": "hostile.cancel_itself"}),
    st.builds(lambda out, err, code: {"task": "hostile.cmd", "payload": {"stdout": out, "stderr": err, "exit": code}},
              STREAM, STREAM, st.sampled_from([0, 0, 1])),
)
# Rows written by other languages or plain SQL: Postgres stores them, Python cannot read them.
RAW_PAYLOADS = st.sampled_from(["[" * 2000 + "]" * 2000, "9" * 5000, '{"a": ' + "[" * 1500 + "]" * 1500 + "}"])


@pytest.fixture(scope="module")
def hostile_db(postgres):
    _, admin_dsn = postgres
    name = f"qw_hostile_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(POISON_CONSTRAINT)
    yield dsn
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def hostile_worker(hostile_db):
    proc = WorkerProcess(hostile_db, "--handlers", "tests.hostile_handlers", "--command", COMMAND,
                         "--concurrency", "16", "--retry-base-seconds", "0.1")
    yield proc
    proc.stop()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


# Python refuses JSON nested deeper than its recursion limit minus the frames already on the stack
# (and test tools may raise that limit), so the boundary depends on who encodes and where: from
# this depth on, success and "not storable" are both right; below it, only success is.
DEPTH_UNCERTAIN_FROM = 850


def _nesting(recipe: object) -> int:
    if isinstance(recipe, dict) and "deep" in recipe:
        return recipe["deep"]
    if isinstance(recipe, dict) and "list" in recipe:
        return 1 + max(map(_nesting, recipe["list"]), default=0)
    if isinstance(recipe, dict) and "dict" in recipe:
        return 1 + max((_nesting(value) for _, value in recipe["dict"]), default=0)
    return 0


def _expected_result(task: dict) -> tuple[str, object]:
    """What the database should hold for a hostile.return task: ("succeeded", result), ("failed",
    None), or ("either", None) from DEPTH_UNCERTAIN_FROM levels of nesting on."""
    if _nesting(task["payload"]["value"]) >= DEPTH_UNCERTAIN_FROM:
        return "either", None
    value = build(task["payload"]["value"])
    try:
        text = jsonvalue.encode(value, RESULT_LIMIT_BYTES)
    except jsonvalue.NotStorable:
        return "failed", None
    stored = json.loads(text)
    if isinstance(stored, dict) and "poison" in stored:
        return "failed", None
    return "succeeded", stored


def _same_json(a: object, b: object) -> bool:
    """Equal as JSON: Postgres keeps numbers as decimals, so compare them as floats."""
    def norm(v: object) -> object:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return v
        if isinstance(v, (int, float)):
            try:
                return float(v) if math.isfinite(float(v)) else v
            except OverflowError:  # an integer past the largest float: compared exactly
                return v
        if isinstance(v, list):
            return [norm(i) for i in v]
        return {k: norm(i) for k, i in v.items()}
    return norm(a) == norm(b)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile=st.lists(HOSTILE_TASKS, min_size=4, max_size=20), raw=st.lists(RAW_PAYLOADS, max_size=2),
       ordinary=st.integers(5, 30))
def test_hostile_tasks_fail_alone_and_ordinary_ones_succeed_exactly_once(hostile_db, hostile_worker, hostile,
                                                                          raw, ordinary):
    specs = [dict(task, max_attempts=1) for task in hostile]
    mixed = specs + [{"task": "ok", "payload": {"n": n}} for n in range(ordinary)]
    mixed.sort(key=lambda _: uuid.uuid4())  # interleave, so hostile outcomes share batches with innocent ones
    with psycopg.connect(hostile_db) as conn:
        ids = enqueue_many(conn, mixed)
        raw_ids = [conn.execute("""INSERT INTO queueworker.tasks (task, payload, delayed, max_attempts)
                                   VALUES ('ok', %s::jsonb, false, 1) RETURNING id""", (text,)).fetchone()[0]
                   for text in raw]
        conn.execute("SELECT pg_notify('queueworker', 'default')")
    every = ids + raw_ids
    wait_until(lambda: scalar(hostile_db, "SELECT count(*) FROM queueworker.tasks WHERE id = ANY(%s) AND state::text "
                                          "= ANY(%s)", (every, list(TERMINAL))) == len(every),
               timeout=90, message="every task terminal")

    rows = {r[0]: r[1:] for r in query(hostile_db, """
        SELECT t.id, t.state::text, t.result, t.error,
               (SELECT count(*) FROM queueworker.task_events e WHERE e.task_id = t.id AND e.to_state = 'succeeded')
        FROM queueworker.tasks t WHERE t.id = ANY(%s)""", (every,))}
    for task_id, spec in zip(ids, mixed):
        state, result, error, successes = rows[task_id]
        if spec["task"] == "ok":
            assert (state, result, successes) == ("succeeded", spec["payload"], 1), (task_id, state, error)
        elif spec["task"].startswith("hostile.return"):
            expected_state, expected_result = _expected_result(spec)
            if expected_state == "either":
                assert state in ("succeeded", "failed"), (spec, error)
                assert state == "succeeded" or "not storable" in error["message"], error
                continue
            assert state == expected_state, (spec, error)
            if state == "succeeded":
                assert _same_json(result, expected_result)
            else:
                assert "not storable" in error["message"] and error["retryable"] is False, error
        elif state == "failed":
            assert error["message"] and error["type"], error
    for task_id in raw_ids:
        state, _, error, _ = rows[task_id]
        assert state == "failed" and error["message"].startswith("payload cannot be decoded"), error

    # The worker still claims new work, and has not grown without bound.
    with psycopg.connect(hostile_db) as conn:
        after = enqueue_many(conn, [{"task": "ok", "payload": {"n": n}} for n in range(10)])
    wait_until(lambda: scalar(hostile_db, "SELECT count(*) FROM queueworker.tasks WHERE id = ANY(%s) "
                                          "AND state = 'succeeded'", (after,)) == 10,
               timeout=30, message="new work done after the hostile batch")
    assert hostile_worker.proc.poll() is None, hostile_worker.log()[-3000:]
    assert _rss_mb(hostile_worker.pid) < RSS_LIMIT_MB


def test_outputs_past_every_limit_fail_alone(hostile_db, hostile_worker):
    """The largest inputs, once each: a result past the 64 MiB limit, a command printing past its
    16 MiB stdout limit, megabytes of NUL bytes on stderr, a 2,000-deep raw payload."""
    big = RESULT_LIMIT_BYTES + 1024
    specs = [{"task": "hostile.return", "payload": {"value": {"blob": big}}, "max_attempts": 1},
             {"task": "hostile.cmd", "payload": {"stdout": {"repeat": [0x78, 17 * 1024 * 1024]}}, "max_attempts": 1},
             {"task": "hostile.cmd", "payload": {"stderr": {"repeat": [0, 5 * 1024 * 1024]}, "exit": 1},
              "max_attempts": 1}]
    with psycopg.connect(hostile_db) as conn:
        ids = enqueue_many(conn, specs + [{"task": "ok", "payload": {"n": n}} for n in range(20)])
    wait_until(lambda: scalar(hostile_db, "SELECT count(*) FROM queueworker.tasks WHERE id = ANY(%s) AND state::text "
                                          "= ANY(%s)", (ids, list(TERMINAL))) == len(ids),
               timeout=120, message="every task terminal")
    errors = [r[0] for r in query(hostile_db, "SELECT error->>'message' FROM queueworker.tasks WHERE id = ANY(%s) "
                                              "ORDER BY id LIMIT 3", (ids,))]
    assert errors[0].startswith("result not storable") and "exceed the limit" in errors[0]
    assert "more than 16,777,216 bytes on stdout" in errors[1]
    assert errors[2].startswith("command exited with status 1") and "\\x00" in errors[2] and len(errors[2]) < 2100
    assert scalar(hostile_db, "SELECT count(*) FROM queueworker.tasks WHERE id = ANY(%s) AND state = 'succeeded'",
                  (ids[3:],)) == 20
    # The worker lives on past them: it still claims new work.
    with psycopg.connect(hostile_db) as conn:
        after = enqueue_many(conn, [{"task": "ok", "payload": {"n": 0}}])
    wait_until(lambda: scalar(hostile_db, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (after[0],))
               == "succeeded", timeout=30, message="new work done after the largest outputs")
    assert hostile_worker.proc.poll() is None
    assert _rss_mb(hostile_worker.pid) < RSS_LIMIT_MB
