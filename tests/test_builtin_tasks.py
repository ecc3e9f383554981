"""Built-in tasks refuse payloads that can never work: one permanent failure, not every retry."""

from __future__ import annotations

import asyncio
import logging
import math

import psycopg
import pytest

from queueworker.runtime.builtin_tasks import fail, sleep
from queueworker.runtime.handlers import PermanentError, TaskContext
from queueworker.client.producer import enqueue_many
from tests.support import FAST_LEASES, WorkerProcess, query, wait_until


def _ctx() -> TaskContext:
    return TaskContext(1, "qw.sleep", "default", 1, 10, logging.getLogger("test"))


@pytest.mark.parametrize("payload", [
    {"seconds": "ten"}, {"seconds": "1"}, {"seconds": math.nan}, {"seconds": math.inf}, {"seconds": -1},
    {"seconds": 1e9}, {"seconds": True}, {"seconds": None}, {"second": 1}, [1], "1", 5,
])
def test_sleep_refuses_a_payload_that_can_never_work(payload):
    with pytest.raises(PermanentError, match="qw.sleep payload is invalid"):
        asyncio.run(sleep(payload, _ctx()))


def test_sleep_takes_whole_and_fractional_seconds():
    assert asyncio.run(sleep({"seconds": 0}, _ctx())) == {"slept": 0, "attempt": 1}
    assert asyncio.run(sleep({"seconds": 0.01}, _ctx()))["slept"] == 0.01


@pytest.mark.parametrize("payload", [
    {"retryable": "no"}, {"retryable": 0}, {"message": 5}, {"message": ""}, {"message": None}, {"why": "x"}, [],
])
def test_fail_refuses_a_payload_that_can_never_work(payload):
    with pytest.raises(PermanentError, match="qw.fail payload is invalid"):
        asyncio.run(fail(payload))


def test_fail_fails_as_asked():
    with pytest.raises(RuntimeError, match="qw.fail failed on purpose") as retryable:
        asyncio.run(fail({}))
    assert not isinstance(retryable.value, PermanentError)
    with pytest.raises(PermanentError, match="^bad$"):
        asyncio.run(fail({"retryable": False, "message": "bad"}))


@pytest.mark.integration
def test_a_worker_fails_an_impossible_sleep_at_its_first_attempt(dsn):
    with psycopg.connect(dsn) as conn:
        ids = enqueue_many(conn, [{"task": "qw.sleep", "payload": {"seconds": "ten"}},
                                  {"task": "qw.sleep", "payload": {"seconds": -1}},
                                  {"task": "qw.fail", "payload": {"retryable": "yes"}}])
        # Valid JSON that jsonb keeps (as a 401-digit number), though no float can hold it.
        ids += [conn.execute("INSERT INTO queueworker.tasks (queue, task, payload) "
                             "VALUES ('default', 'qw.sleep', '{\"seconds\": 1e400}') RETURNING id").fetchone()[0]]
    worker = WorkerProcess(dsn, *FAST_LEASES)
    try:
        wait_until(lambda: query(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'failed'")[0][0] == 4,
                   message="all four tasks failed")
        rows = query(dsn, "SELECT attempts, error->>'message', (error->>'retryable')::bool FROM queueworker.tasks "
                          "WHERE id = ANY(%s) ORDER BY id", (ids,))
    finally:
        worker.signal(15)
        worker.wait()
        worker.stop()
    assert [(attempts, retryable) for attempts, _, retryable in rows] == [(1, False)] * 4
    assert "seconds: Input should be a valid number" in rows[0][1]
    assert "greater than or equal to 0" in rows[1][1]
    assert "retryable: Input should be a valid boolean" in rows[2][1]
    assert "qw.sleep payload is invalid: seconds" in rows[3][1]


@pytest.mark.integration
def test_without_the_switch_a_worker_runs_no_builtin_task(dsn):
    """Production workers leave qw.* out: a producer's qw.fail cannot fail anything in their queue
    (nor open its breaker); the task is handed back as unknown, without an attempt spent."""
    with psycopg.connect(dsn) as conn:
        (task_id,) = enqueue_many(conn, [{"task": "qw.fail", "payload": {"retryable": False}}])
    worker = WorkerProcess(dsn, *FAST_LEASES, builtin_tasks=False)
    try:
        wait_until(lambda: query(dsn, "SELECT count(*) FROM queueworker.task_events WHERE task_id = %s "
                                      "AND from_state = 'running' AND to_state = 'pending'", (task_id,))[0][0] >= 1,
                   message="the unknown task handed back")
        state, attempts, message = query(dsn, "SELECT state::text, attempts, error->>'message' FROM queueworker.tasks "
                                              "WHERE id = %s", (task_id,))[0]
    finally:
        worker.signal(15)
        worker.wait()
        worker.stop()
    assert (state, attempts) == ("pending", 0) and "qw.fail" in message


def test_builtin_tasks_go_only_to_the_default_registry(dsn):
    from queueworker import Registry, Worker, WorkerSettings

    with pytest.raises(ValueError, match="register_builtin_tasks"):
        Worker(dsn, WorkerSettings(builtin_tasks=True), Registry())
    own = Registry()
    Worker(dsn, WorkerSettings(), own)
    assert not [name for name in own.names() if name.startswith("qw.")]
