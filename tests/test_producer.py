"""The producer API: hostile input fails as a ValidationError before the database; what passes is
stored exactly, its payload encoded once."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from decimal import Decimal

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pydantic import ValidationError

from queueworker import TaskSpec, enqueue, enqueue_many, jsonvalue
from queueworker.names import INT4_MAX
from tests.support import query


def _exact(text: str):
    return json.loads(text, parse_float=Decimal, parse_int=Decimal)


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("options, message", [
    ({"delay": math.inf}, "finite number"),
    ({"delay": math.nan}, "finite number"),
    ({"delay": 1e308}, "less than or equal to 2147483647"),
    ({"delay": -1}, "greater than or equal to 0"),
    ({"timeout_seconds": INT4_MAX + 1}, "less than or equal to 2147483647"),
    ({"timeout_seconds": 1.5}, "valid integer"),
    ({"priority": INT4_MAX + 1}, "less than or equal to 2147483647"),
    ({"priority": -(2**31) - 1}, "greater than or equal to -2147483648"),
    ({"max_attempts": 10**30}, "less than or equal to 1000"),
    ({"payload": {"x": math.nan}}, "NaN and Infinity"),
    ({"payload": [math.inf]}, "NaN and Infinity"),
    ({"payload": {"x": "a\x00b"}}, "NUL character"),
    ({"payload": {"a\x00": 1}}, "NUL character"),
    ({"payload": "\ud800"}, "lone UTF-16 surrogate"),
    ({"payload": _nested(100_000)}, "nested too deeply"),
    ({"payload": 10**5000}, "4,300 digits"),
    ({"payload": {1, 2}}, "not JSON-serialisable"),
    ({"task": "a\x00b"}, "printable"),
    ({"task": "tab\there"}, "printable"),
    ({"task": "line\nbreak"}, "printable"),
    ({"task": "bell\x07"}, "printable"),
    ({"task": "del\x7f"}, "printable"),
    ({"task": "sep\u2028"}, "printable"),
    ({"task": "\ud800"}, "valid string"),
    ({"task": "   "}, "printable"),
    ({"task": "x" * 201}, "at most 200"),
    ({"queue": "mail\n"}, "should match pattern"),
    ({"queue": "ma\x00il"}, "should match pattern"),
    ({"payload_json": "{}"}, "derived from payload"),
])
def test_hostile_values_fail_before_the_database(options, message):
    with pytest.raises(ValidationError, match=message):
        TaskSpec(**{"task": "t", **options})


@settings(max_examples=300, deadline=None)
@given(delay=st.floats(), priority=st.integers(), timeout=st.integers() | st.floats())
def test_any_number_is_a_spec_or_a_validation_error(delay, priority, timeout):
    try:
        spec = TaskSpec(task="t", delay=delay, priority=priority, timeout_seconds=timeout)
    except ValidationError:
        return
    assert spec.due_at(datetime.now(timezone.utc)) is None or spec.delay > 0
    assert -(2**31) <= spec.priority <= INT4_MAX and 0 < spec.timeout_seconds <= INT4_MAX


@pytest.mark.integration
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(min_size=1, max_size=200), payload=st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20))
def test_whatever_validates_is_stored_exactly(dsn, name, payload):
    try:
        spec = TaskSpec(task=name, payload=payload)
    except ValidationError:
        return
    with psycopg.connect(dsn, autocommit=True) as conn:
        (task_id,) = enqueue_many(conn, [spec])
    stored_name, stored_payload = query(dsn, "SELECT task, payload::text FROM queueworker.tasks WHERE id = %s",
                                        (task_id,))[0]
    assert stored_name == name
    # jsonb keeps numbers as `numeric` (6.4e+16 comes back as 64000000000000000): compare values
    assert _exact(stored_payload) == _exact(spec.payload_json)


@pytest.mark.integration
def test_enqueue_encodes_each_payload_once_and_sends_that_text(dsn, monkeypatch):
    encoded = []
    real_encode = jsonvalue.encode

    def counting_encode(value, limit_bytes=None):
        encoded.append(value)
        return real_encode(value, limit_bytes)

    def no_second_dump(*args, **kwargs):
        raise AssertionError("a payload was dumped a second time")

    monkeypatch.setattr(jsonvalue, "encode", counting_encode)
    payloads = [{"n": n, "text": "é\u2028\U0001f600", "big": 2**80, "nested": [[{"x": None}]]} for n in range(7)]
    with psycopg.connect(dsn) as conn:
        monkeypatch.setattr(json, "dumps", no_second_dump)
        ids = enqueue_many(conn, [{"task": "t", "payload": p} for p in payloads])
        ids.append(enqueue(conn, "t", payloads[0]))
        monkeypatch.undo()
    assert len(encoded) == len(payloads) + 1
    stored = dict(query(dsn, "SELECT id, payload FROM queueworker.tasks"))
    assert [stored[i] for i in ids] == payloads + payloads[:1]


@pytest.mark.integration
def test_the_python_api_refuses_before_anything_is_written(dsn):
    with psycopg.connect(dsn) as conn:
        with pytest.raises(ValidationError, match="NUL character"):
            enqueue_many(conn, [{"task": "ok", "payload": {"n": 1}}, {"task": "bad", "payload": "\x00"}])
        with pytest.raises(ValidationError, match="finite number"):
            enqueue(conn, "t", delay=math.inf)
        conn.commit()
    assert query(dsn, "SELECT count(*) FROM queueworker.tasks") == [(0,)]


# A task's stored fields, its due time as given or as "when created" (the database's clock).
STORED = ("queue, task, state, delayed, priority, CASE WHEN run_after <> created_at THEN run_after END, attempts, "
          "max_attempts, timeout_seconds, payload, headers, key, spec_hash, fair_tag IS NOT NULL AS tagged")


@pytest.mark.integration
@pytest.mark.parametrize("fields", [
    {},
    {"queue": "q1", "priority": -7, "max_attempts": 3, "timeout_seconds": 42, "headers": {"traceparent": "x"},
     "key": "tenant-1", "payload": {"n": [1, "é"]}},
    {"queue": "q2", "run_after": datetime(2031, 1, 2, 3, 4, 5, tzinfo=timezone.utc)},
], ids=["defaults", "every field", "due later"])
def test_a_spec_enqueued_alone_is_stored_and_announced_as_in_a_batch(dsn, fields):
    """One spec goes in by a statement of its own (enqueue.sql, `enqueue_one`), a batch by arrays: the
    same row, audit row and notification either way."""
    spec = {"task": "t", **fields}
    with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn, autocommit=True) as conn:
        listener.execute("LISTEN queueworker")
        (alone,) = enqueue_many(conn, [spec])
        batch = enqueue_many(conn, [spec, {"task": "other", "queue": "elsewhere"}])
        notices = [notify.payload for notify in listener.notifies(timeout=1.0, stop_after=3)]
    rows = {task_id: query(dsn, f"SELECT {STORED} FROM queueworker.tasks WHERE id = %s", (task_id,))[0]
            for task_id in (alone, batch[0])}
    assert rows[alone] == rows[batch[0]]
    audits = query(dsn, "SELECT task_id, from_state, to_state FROM queueworker.task_events WHERE task_id IN (%s, %s)",
                   (alone, batch[0]))
    assert sorted(audit[1:] for audit in audits) == [(None, "pending"), (None, "pending")]
    announced = [payload for payload in notices if payload.split(" ")[0] == spec.get("queue", "default")]
    assert len(announced) == 2 and announced[0] == announced[1], notices
    assert (announced[0] != spec.get("queue", "default")) == ("run_after" in fields), announced  # "queue epoch"
