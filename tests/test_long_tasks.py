"""Long tasks: checkpoints that survive a drain and a SIGKILL, progress, pages (Continue), Snooze,
RetryAfter, prompt cancellation, and reading a task back (get_task, `queueworker show`)."""

from __future__ import annotations

import json
import logging
import math
import signal
import subprocess
import sys
import time
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from queueworker import Continue, RetryAfter, Snooze, TaskContext, cancel, cancel_many, enqueue, get_task, jsonvalue, wait_for
from queueworker.client import results
from queueworker.db import duties, lease, statements
from tests.support import FAST_LEASES, WorkerProcess, query, scalar, wait_until

HANDLERS = ("--handlers", "tests.long_task_handlers")
CLAIM = {"queue": "default", "limit": 10, "lease_seconds": 30, "timeout_seconds": 60}


def context() -> TaskContext:
    return TaskContext(1, "t", "default", 1, 3, logging.getLogger("test"))


# -- unit ------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: Snooze(math.nan), lambda: Snooze(-1), lambda: Snooze("soon"),
                                  lambda: RetryAfter(math.inf), lambda: Continue({}, delay=-5),
                                  lambda: Snooze(10 ** 12)])
def test_bad_delays_are_refused_where_the_handler_makes_them(make):
    with pytest.raises(ValueError, match="seconds"):
        make()


def test_progress_refuses_what_cannot_be_stored_and_bounds_the_message():
    ctx = context()
    with pytest.raises(ValueError, match="NaN"):
        ctx.progress(math.nan)
    with pytest.raises(TypeError, match="number"):
        ctx.progress("half")
    ctx.progress(3, 10, "x\x00" * 1000)
    stored = json.loads(ctx.progress_json)
    assert (stored["done"], stored["total"]) == (3, 10) and "\x00" not in stored["message"]
    assert len(stored["message"]) <= 520


def test_save_checkpoint_needs_a_worker_and_storable_json():
    ctx = context()
    with pytest.raises(ValueError, match="NaN"):
        ctx.save_checkpoint({"x": math.nan})
    with pytest.raises(RuntimeError, match="inside a queueworker worker"):
        ctx.save_checkpoint({"x": 1})


# -- the statements ---------------------------------------------------------------------------

def _claim(conn) -> lease.ClaimedRow:
    row, = statements.fetch(conn, lease.CLAIM, lease.ClaimParams(**CLAIM, worker=uuid.uuid4()))
    return row


@pytest.mark.integration
def test_a_checkpoint_write_is_fenced_by_the_lease_and_reaches_the_next_attempt(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        task_id = enqueue(conn, "qw.noop")
        first = _claim(conn)
        assert first.checkpoint_json is None
        save = {"id": task_id, "token": first.lease_token, "checkpoint": Jsonb({"next": 5}),
                "progress": Jsonb({"done": 5})}
        assert statements.fetch(conn, lease.SAVE_CHECKPOINT, lease.SaveCheckpointParams(**save)) == [
            (task_id, first.lease_token)]
        conn.execute("UPDATE queueworker.tasks SET leased_until = now() - interval '1 s' WHERE id = %s", (task_id,))
        statements.fetch(conn, duties.RESCUE, duties.RescueParams(deadline_grace=60,
                                                                  worker_ttl=60, limit=10))
        second = _claim(conn)
        assert json.loads(second.checkpoint_json) == {"next": 5}, "the rescued task resumes from its checkpoint"
        stale = {**save, "checkpoint": Jsonb({"next": 99})}
        assert statements.fetch(conn, lease.SAVE_CHECKPOINT, lease.SaveCheckpointParams(**stale)) == [], \
            "the old lease writes nothing"
        assert scalar(dsn, "SELECT checkpoint FROM queueworker.tasks WHERE id = %s", (task_id,)) == {"next": 5}
        statements.fetch(conn, lease.COMPLETE_SUCCEEDED, lease.CompleteSucceededParams(
            ids=[task_id], tokens=[second.lease_token], results=[None]))
    info = get_task(psycopg.connect(dsn), task_id)
    assert (info.state, info.checkpoint, info.progress) == ("succeeded", None, {"done": 5}), \
        "success drops the checkpoint and keeps the progress"


@pytest.mark.integration
def test_get_task_reads_back_and_says_which_field_python_cannot_read(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        task_id = enqueue(conn, "t", {"a": [1, 2]}, priority=3)
        info = get_task(conn, task_id)
        assert (info.task, info.state, info.payload, info.priority, info.finished) == ("t", "pending", {"a": [1, 2]},
                                                                                      3, False)
        assert get_task(conn, 10 ** 12) is None
        conn.execute("UPDATE queueworker.tasks SET payload = %s::jsonb WHERE id = %s",
                     ("[" * 3000 + "]" * 3000, task_id))
        with pytest.raises(jsonvalue.Undecodable, match=f"task {task_id}'s payload cannot be decoded"):
            get_task(conn, task_id)


@pytest.mark.integration
def test_a_heartbeat_never_puts_back_an_older_progress_than_the_row_holds(dsn):
    """A beat reads the handler's report before it waits for its connection; a checkpoint with the
    next report may be written meanwhile. The older report must not replace it: the task's success
    keeps whatever the row holds."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        task_id = enqueue(conn, "qw.noop")
        claimed = _claim(conn)
        worker = scalar(dsn, "SELECT lease_owner FROM queueworker.tasks WHERE id = %s", (task_id,))

        def beat(progress: dict) -> list:
            return statements.fetch(conn, lease.HEARTBEAT, lease.HeartbeatParams(
                worker=worker, hostname="h", pod_name=None, pod_namespace=None, pid=1, queues=["default"],
                concurrency=1, running=1, draining=False, version="t", lease_seconds=30, ids=[task_id],
                tokens=[claimed.lease_token], progresses=[json.dumps(progress)]))

        def checkpoint(progress: dict) -> None:
            assert statements.fetch(conn, lease.SAVE_CHECKPOINT, lease.SaveCheckpointParams(
                id=task_id, token=claimed.lease_token, checkpoint=json.dumps({"next": progress["done"]}),
                progress=json.dumps(progress))) == [(task_id, claimed.lease_token)]

        def stored() -> dict:
            return scalar(dsn, "SELECT progress FROM queueworker.tasks WHERE id = %s", (task_id,))

        checkpoint({"done": 80, "at": 200.5})
        assert beat({"done": 79, "at": 200.25}) == [(task_id, claimed.lease_token, True)]
        assert stored()["done"] == 80, "the beat's older report was put back"
        assert beat({"done": 81, "at": 300}) == [(task_id, claimed.lease_token, True)]
        assert stored()["done"] == 81
        checkpoint({"done": 70, "at": 250})
        assert stored()["done"] == 81 and scalar(dsn, "SELECT checkpoint FROM queueworker.tasks WHERE id = %s",
                                                 (task_id,)) == {"next": 70}, "the checkpoint itself is written"
        for odd in ({"done": 1, "at": "soon"}, {"done": 2, "at": None}, {"done": 3, "at": [1]}):
            assert beat(odd) == [(task_id, claimed.lease_token, True)], f"{odd} stopped the beat"
        beat({"done": 82})
        assert stored()["done"] == 82, "a report without `at` is taken"
        statements.fetch(conn, lease.COMPLETE_SUCCEEDED, lease.CompleteSucceededParams(
            ids=[task_id], tokens=[claimed.lease_token], results=[None]))
    assert get_task(psycopg.connect(dsn), task_id).progress["done"] == 82


# -- real workers -----------------------------------------------------------------------------

def checkpoint_next(dsn: str, task_id: int) -> int:
    value = scalar(dsn, "SELECT checkpoint FROM queueworker.tasks WHERE id = %s", (task_id,))
    return value["next"] if value else 0


def qw(dsn: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queueworker.cli", *args, "--dsn", dsn],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.integration
def test_a_checkpointing_task_drained_then_killed_resumes_each_time_from_its_last_checkpoint(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        task_id = enqueue(conn, "long.count", {"to": 80, "step_seconds": 0.25})  # a 20-second task
    drained = WorkerProcess(dsn, *HANDLERS, "--drain-seconds", "0.3", *FAST_LEASES)
    try:
        wait_until(lambda: checkpoint_next(dsn, task_id) >= 10, timeout=30, message="ten steps")
        progress = json.loads(qw(dsn, "show", str(task_id), "--json").stdout)["progress_json"]
        assert json.loads(progress)["total"] == 80, "progress is visible while the task runs"
        drained.signal(signal.SIGTERM)
        assert drained.wait(30) == 0
    finally:
        drained.stop()
    after_drain = checkpoint_next(dsn, task_id)
    assert scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (task_id,)) == "pending"

    killed = WorkerProcess(dsn, *HANDLERS, *FAST_LEASES)
    try:
        wait_until(lambda: checkpoint_next(dsn, task_id) >= after_drain + 10, timeout=30, message="ten more steps")
        killed.signal(signal.SIGKILL)
        killed.wait(10)
    finally:
        killed.stop()
    after_kill = checkpoint_next(dsn, task_id)

    finisher = WorkerProcess(dsn, *HANDLERS, *FAST_LEASES)
    try:
        wait_until(lambda: scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (task_id,))
                   == "succeeded", timeout=60, message="the task to finish")
    finally:
        finisher.stop()
    info = get_task(psycopg.connect(dsn), task_id)
    assert info.result["resumed_from"] == after_kill >= after_drain + 10 > after_drain >= 10
    assert info.attempts == 2, "the drain gave its attempt back; the kill spent one"
    assert info.progress["done"] == 80
    shown = qw(dsn, "show", str(task_id))
    assert shown.returncode == 0 and '"message": "step 80"' in shown.stdout and "running   -> pending" in shown.stdout


@pytest.mark.integration
def test_a_hundred_pages_continue_once_each_and_in_order_through_a_sigkill(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = enqueue(conn, "long.page", {"page": 0, "pages": 100, "sleep": 0.03})
    worker = WorkerProcess(dsn, *HANDLERS, *FAST_LEASES)
    try:
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") >= 30,
                   timeout=60, message="thirty pages")
        worker.signal(signal.SIGKILL)
        worker.wait(10)
    finally:
        worker.stop()
    worker = WorkerProcess(dsn, *HANDLERS, *FAST_LEASES)
    try:
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE (payload ->> 'page')::int = 99 "
                                       "AND state = 'succeeded'") == 1, timeout=120, message="the last page")
    finally:
        worker.stop()
    pages = query(dsn, "SELECT id, (payload ->> 'page')::int, state::text, continued_from FROM queueworker.tasks "
                       "ORDER BY id")
    assert [page for _, page, _, _ in pages] == list(range(100)), "each page enqueued once, in order"
    assert {state for _, _, state, _ in pages} == {"succeeded"}
    assert [continued_from for _, _, _, continued_from in pages] == [None] + [task_id for task_id, *_ in pages[:-1]]
    assert pages[0][0] == first
    assert scalar(dsn, "SELECT count(*) FROM queueworker.task_events WHERE to_state = 'succeeded'") == 100


@pytest.mark.integration
def test_snooze_waits_without_spending_an_attempt_and_retry_after_sets_the_delay(dsn):
    worker = WorkerProcess(dsn, *HANDLERS, "--retry-base-seconds", "30")
    try:
        # Enqueued once the worker is up, so that it claims the snoozer well before `until`.
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.workers") == 1, message="the worker to start")
        with psycopg.connect(dsn, autocommit=True) as conn:
            until = time.time() + 1.5
            snoozer = enqueue(conn, "long.wait_until", {"until": until}, max_attempts=1)
            limited = enqueue(conn, "long.rate_limited", {"retry_after": 2.0})
            checkpointer = enqueue(conn, "long.async_checkpoint")
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == 3,
                   timeout=30, message="all three to succeed")
    finally:
        worker.stop()
    with psycopg.connect(dsn) as conn:
        snoozed, retried, saved = (get_task(conn, i) for i in (snoozer, limited, checkpointer))
    assert (snoozed.result, snoozed.attempts) == ({"attempt": 1}, 1), "snoozing spent no attempt"
    assert snoozed.started_at.timestamp() >= until
    assert query(dsn, "SELECT detail ->> 'error_type' FROM queueworker.task_events WHERE task_id = %s "
                      "AND from_state = 'running' AND to_state = 'pending'", (snoozer,))[0] == ("Snoozed",)
    assert retried.result == {"attempt": 2}
    failed_at, restarted_at = (row[0] for row in query(
        dsn, "SELECT at FROM queueworker.task_events WHERE task_id = %s AND to_state IN ('retrying', 'running') "
             "AND from_state IS NOT NULL ORDER BY id OFFSET 1", (limited,)))
    assert 2.0 <= (restarted_at - failed_at).total_seconds() < 30, "Retry-After's delay, not the 30 s backoff"
    assert saved.result == {"saved": True, "checkpoint": {"half": True}}
    assert saved.progress["message"] == "half"


# -- cancellation -----------------------------------------------------------------------------

def test_cancel_many_refuses_unclear_requests():
    for kwargs, message in (({}, "ids or a queue"), ({"ids": [1], "queue": "q"}, "ids or a queue"),
                            ({"ids": [0]}, "not a task id"), ({"ids": [True]}, "not a task id"),
                            ({"queue": "q", "states": ["succeeded"]}, "states must be"),
                            ({"queue": "q", "reason": " "}, "reason")):
        with pytest.raises(ValueError, match=message):
            cancel_many(None, **kwargs)


def _wait_report(path, timeout: float = 30) -> dict:
    return wait_until(lambda: _read_report(path), timeout=timeout, message=f"{path.name} to be written")


def _read_report(path) -> dict | None:
    """The report once written whole (a JSON object is not valid until its last byte is in)."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


@pytest.mark.integration
@pytest.mark.parametrize("handler", ["long.until_cancelled", "long.async_until_cancelled"])
def test_cancelling_a_running_task_stops_its_handler_within_a_second_and_frees_the_slot(dsn, tmp_path, handler):
    report = tmp_path / "report.json"
    with psycopg.connect(dsn, autocommit=True) as conn:
        task_id = enqueue(conn, handler, {"report": str(report)})
    worker = WorkerProcess(dsn, *HANDLERS, "--concurrency", "1", "--heartbeat-seconds", "10")
    try:
        wait_until(lambda: scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (task_id,))
                   == "running", message="the task to start")
        with psycopg.connect(dsn, autocommit=True) as conn:
            follower = enqueue(conn, "qw.noop")
            cancelled_at = time.time()
            assert cancel(conn, task_id, reason="customer withdrew the order")
        stopped = _wait_report(report)
        wait_until(lambda: scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (follower,))
                   == "succeeded", timeout=5, message="the freed slot to run the next task")
        log = worker.log()
    finally:
        worker.stop()
    assert stopped["reason"] == "cancelled"
    assert stopped["at"] - cancelled_at < 1.0, "the NOTIFY reached the worker holding the lease"
    info = get_task(psycopg.connect(dsn), task_id)
    assert info.state == "cancelled" and info.error["type"] == "Cancelled"
    assert info.error["message"].startswith("customer withdrew the order (by ")
    assert "stale" not in log, "the stopped handler's outcome is dropped quietly"


@pytest.mark.integration
def test_a_cancellation_whose_notice_is_lost_is_found_by_the_next_heartbeat(dsn, tmp_path):
    report = tmp_path / "report.json"
    with psycopg.connect(dsn, autocommit=True) as conn:
        task_id = enqueue(conn, "long.until_cancelled", {"report": str(report)})
    worker = WorkerProcess(dsn, *HANDLERS, *FAST_LEASES)
    try:
        wait_until(lambda: scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (task_id,))
                   == "running", message="the task to start")
        with psycopg.connect(dsn, autocommit=True) as conn:
            # The cancel statement without its NOTIFY: as if the notice never arrived.
            conn.execute("UPDATE queueworker.tasks SET state = 'cancelled', lease_owner = NULL, finished_at = now() "
                         "WHERE id = %s", (task_id,))
            cancelled_at = time.time()
        stopped = _wait_report(report)
    finally:
        worker.stop()
    assert stopped["reason"] == "cancelled"
    assert stopped["at"] - cancelled_at < 2.5, "within one heartbeat (1 s here) and the fence's margin"


@pytest.mark.integration
def test_cli_cancels_by_id_and_by_queue_and_says_what_it_could_not(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        first, second = (enqueue(conn, "t", queue="batch") for _ in range(2))
        others = [enqueue(conn, "t", queue="bulk", delay=3600) for _ in range(3)]
        done = enqueue(conn, "t", queue="batch")
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() WHERE id = %s", (done,))
    by_id = qw(dsn, "cancel", str(first), str(second), "--reason", "duplicate order")
    assert by_id.returncode == 0 and f"task {first} cancelled (was pending)" in by_id.stdout, by_id
    refused = qw(dsn, "cancel", str(first), str(done), "999999")
    assert refused.returncode == 2
    assert f"task {first} is cancelled; task {done} is succeeded; no task with id 999999" in refused.stderr
    by_queue = qw(dsn, "cancel", "--queue", "bulk")
    assert by_queue.returncode == 0 and "3 tasks of queue bulk cancelled" in by_queue.stdout
    assert {get_task(psycopg.connect(dsn), i).state for i in others} == {"cancelled"}
    assert qw(dsn, "cancel", "1", "--queue", "bulk").returncode == 2


# -- results: wait_for, list, status --stuck ------------------------------------------------------

@pytest.mark.integration
def test_wait_for_hears_a_task_finish_at_once_whichever_way_it_ends(dsn, monkeypatch):
    monkeypatch.setattr(results, "WAIT_POLL_SECONDS", 60.0)  # only the notification can end a wait early
    with psycopg.connect(dsn, autocommit=True) as conn:
        slow, failing, doomed = (enqueue(conn, task, payload, notify_on_finish=True, max_attempts=1)
                                 for task, payload in (("qw.sleep", {"seconds": 0.5}),
                                                       ("qw.fail", {"retryable": False, "message": "no"}),
                                                       ("qw.sleep", {"seconds": 60})))
    worker = WorkerProcess(dsn)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            started = time.monotonic()
            assert wait_for(conn, slow, timeout=30).state == "succeeded"
            assert wait_for(conn, failing, timeout=30).error["message"] == "no"
            wait_until(lambda: get_task(conn, doomed).state == "running", message="the long one to start")
            with psycopg.connect(dsn, autocommit=True) as other:
                cancel(other, doomed)
            assert wait_for(conn, doomed, timeout=30).state == "cancelled"
            assert time.monotonic() - started < 10, "notified, not polled"
    finally:
        worker.stop()


@pytest.mark.integration
def test_wait_for_polls_without_a_notification_and_says_when_it_gives_up(dsn, monkeypatch):
    monkeypatch.setattr(results, "WAIT_POLL_SECONDS", 0.1)
    with psycopg.connect(dsn) as conn:  # not autocommit: no LISTEN, polling only
        task_id = enqueue(conn, "qw.noop")
        conn.commit()
        with pytest.raises(TimeoutError, match=f"task {task_id} is still pending after 0.3 s"):
            wait_for(conn, task_id, timeout=0.3)
        with pytest.raises(LookupError, match="no task with id 999999"):
            wait_for(conn, 999999, timeout=1)
        with pytest.raises(ValueError, match="timeout"):
            wait_for(conn, task_id, timeout=math.nan)
        conn.execute("UPDATE queueworker.tasks SET state = 'cancelled', finished_at = now() WHERE id = %s",
                     (task_id,))
        conn.commit()
        assert wait_for(conn, task_id, timeout=5).state == "cancelled"


@pytest.mark.integration
def test_cli_lists_tasks_with_progress_and_status_shows_stuck_ones(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = enqueue(conn, "a", queue="lst")
        enqueue(conn, "b", queue="lst")
        conn.execute("UPDATE queueworker.tasks SET progress = %s WHERE id = %s",
                     (Jsonb({"done": 3, "total": 10, "message": "page 3"}), first))
        statements.fetch(conn, lease.CLAIM, lease.ClaimParams(**{**CLAIM, "queue": "lst", "limit": 1},
                                                              worker=uuid.uuid4()))
        conn.execute("UPDATE queueworker.tasks SET leased_until = now() - interval '42 s' WHERE state = 'running'")
    listed = qw(dsn, "list", "--queue", "lst")
    assert listed.returncode == 0 and "3/10 page 3" in listed.stdout, listed
    assert [row["id"] for row in json.loads(qw(dsn, "list", "--state", "running", "--json").stdout)] == [first]
    report = json.loads(qw(dsn, "status", "--stuck", "--json").stdout)
    assert [(task["id"], task["expired_for"] > 40) for task in report["stuck"]] == [(first, True)]
    assert "STUCK TASK" in qw(dsn, "status", "--stuck").stdout


@pytest.mark.parametrize(("stored", "shown"), [
    ('{"done": 3, "total": 10, "message": "page 3"}', "3/10 page 3"),
    ('{"done": 2.5}', "2.5"),
    ('{"done": "x"}', '{"done": "x"}'),        # written by hand: shown as stored
    ('[1, 2]', "[1, 2]"),
    ('{"total": 4}', '{"total": 4}'),
    ("[" * 3000 + "]" * 3000, "[" * 80),         # deeper than Python reads
    ('{"done": 1e999}', "inf"),                 # past a float: Python reads infinity
])
def test_progress_is_described_whatever_was_stored(stored, shown):
    from queueworker.client.status import describe_progress
    assert describe_progress(stored) == shown
