"""Integration: finished tasks live in their own partition (migration 002), against a real Postgres.

Covers the move itself (audited like any transition), the upgrade of a version-1 database with
its rows, ids and audit trail intact, and the one new failure mode the move brings: a statement
that meets a row a concurrent transaction just moved gets SQLSTATE 40001, and is re-run.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg.types.json import Jsonb

from queueworker.db import lease, statements, tasks
from queueworker.db.connection import DutyConnection
from queueworker.db.migrate import available_migrations, migrate
from queueworker.client.producer import enqueue
from tests.schema_history import insert_plain_tasks, migrate_to
from tests.support import query, scalar, wait_until

pytestmark = pytest.mark.integration

CLAIM = {"queue": "default", "limit": 1, "lease_seconds": 30, "timeout_seconds": 60}


def _moved_row_retries() -> float:
    return REGISTRY.get_sample_value("queueworker_moved_row_retries_total") or 0.0


def _partition_of(dsn: str, task_id: int) -> str:
    return scalar(dsn, "SELECT tableoid::regclass::text FROM queueworker.tasks WHERE id = %s", (task_id,))


def _claim_one(conn: psycopg.Connection) -> tuple[int, int]:
    (task_id, token), = [(r.id, r.lease_token) for r in statements.fetch(
        conn, lease.CLAIM, lease.ClaimParams(**CLAIM, worker=uuid.uuid4()))]
    return task_id, token


def test_finishing_moves_the_row_to_the_finished_partition_and_retry_moves_it_back(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        task_id = enqueue(conn, "qw.noop")
        assert _partition_of(dsn, task_id) == "queueworker.tasks_active"
        _, token = _claim_one(conn)
        assert _fail_permanently(conn, task_id, token) == [(task_id, token, "failed")]
        assert _partition_of(dsn, task_id) == "queueworker.tasks_finished"
        assert statements.fetch_one(conn, tasks.RETRY_TASK, tasks.TaskParams(id=task_id)).id == task_id
    assert _partition_of(dsn, task_id) == "queueworker.tasks_active"
    assert query(dsn, "SELECT from_state::text, to_state::text FROM queueworker.task_events "
                      "WHERE task_id = %s ORDER BY id", (task_id,)) == [
        (None, "pending"), ("pending", "running"), ("running", "failed"), ("failed", "pending")]


def test_success_moves_rows_itself_and_audits_the_transition(dsn):
    worker = uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as conn:
        task_id = enqueue(conn, "qw.noop", {"k": "v"}, priority=3)
        (_, token), = [(r.id, r.lease_token) for r in statements.fetch(
            conn, lease.CLAIM, lease.ClaimParams(**CLAIM, worker=worker))]
        stale = statements.fetch(conn, lease.COMPLETE_SUCCEEDED, lease.CompleteSucceededParams(
            ids=[task_id], tokens=[token + 1], results=[Jsonb(1)]))
        assert stale == [], "a stale token moves nothing"
        assert statements.fetch(conn, lease.COMPLETE_SUCCEEDED, lease.CompleteSucceededParams(
            ids=[task_id], tokens=[token], results=[Jsonb({"ok": True})])) == [(task_id, token)]
    assert _partition_of(dsn, task_id) == "queueworker.tasks_finished"
    assert query(dsn, "SELECT state::text, payload, priority, result, attempts, lease_owner, leased_until, "
                      "finished_at IS NOT NULL FROM queueworker.tasks WHERE id = %s", (task_id,)) == [
        ("succeeded", {"k": "v"}, 3, {"ok": True}, 1, worker, None, True)]
    assert query(dsn, "SELECT from_state::text, to_state::text, worker, lease_token, detail "
                      "FROM queueworker.task_events WHERE task_id = %s ORDER BY id DESC LIMIT 1", (task_id,)) == [
        ("running", "succeeded", worker, token, {"attempts": 1})]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM queueworker.tasks_active")  # a plain delete is no transition
    assert scalar(dsn, "SELECT count(*) FROM queueworker.task_events WHERE task_id = %s", (task_id,)) == 3


def test_upgrading_a_version_1_database_keeps_rows_ids_and_audit_trail(blank_dsn):
    migrate_to(blank_dsn, 1)
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        ids = insert_plain_tasks(conn, [("default", "qw.noop", {"n": n}) for n in range(4)])
        running, finished = ids[:2]
        conn.execute("""UPDATE queueworker.tasks SET state = 'running', lease_owner = %s, lease_token = 1,
                        leased_until = now() + interval '1 minute', deadline_at = now() + interval '1 hour'
                        WHERE id = %s""", (uuid.uuid4(), running))
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() WHERE id = %s",
                     (finished,))
        conn.execute("DELETE FROM queueworker.tasks WHERE id = %s", (ids[-1],))  # the sequence is past max(id)
    before = query(blank_dsn, "SELECT id, state::text, payload FROM queueworker.tasks ORDER BY id")
    events_before = scalar(blank_dsn, "SELECT count(*) FROM queueworker.task_events")

    assert [m.version for m in migrate(blank_dsn)] == [m.version for m in available_migrations()[1:]]

    assert query(blank_dsn, "SELECT id, state::text, payload FROM queueworker.tasks ORDER BY id") == before
    assert scalar(blank_dsn, "SELECT count(*) FROM queueworker.task_events") == events_before, \
        "copying the rows must not write audit rows"
    assert _partition_of(blank_dsn, finished) == "queueworker.tasks_finished"
    assert _partition_of(blank_dsn, running) == "queueworker.tasks_active"
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        assert enqueue(conn, "qw.noop") > ids[-1], "ids continue after every id ever handed out"
    assert scalar(blank_dsn, "SELECT to_regclass('queueworker.tasks_v1')") is None


def _wait_for_lock_wait(dsn: str, application_name: str) -> None:
    wait_until(lambda: scalar(dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                                   "AND wait_event_type = 'Lock'", (application_name,)) == 1,
               timeout=10, message=f"{application_name} waiting for the row lock")


def _fail_permanently(conn: psycopg.Connection, task_id: int, token: int) -> list[tuple]:
    """complete_failed, which moves the row by an UPDATE routed through the partitioned parent."""
    return statements.fetch(conn, lease.COMPLETE_FAILED, lease.CompleteFailedParams(
        ids=[task_id], tokens=[token], retryables=[False], backoffs=[0.0],
        errors=[Jsonb({"type": "E", "message": "x"})]))


def _heartbeat_params(worker: uuid.UUID, task_id: int, token: int) -> lease.HeartbeatParams:
    return lease.HeartbeatParams(worker=worker, hostname="h", pod_name=None, pod_namespace=None, pid=1,
                                 queues=["default"], concurrency=1, running=1, draining=False, version="t",
                                 lease_seconds=30, ids=[task_id], tokens=[token], progresses=[None])


def test_a_statement_that_meets_a_row_moved_meanwhile_is_rerun_not_failed(dsn):
    """A failure moves a row while a checkpoint waits for its lock: Postgres fails the checkpoint
    with 40001 (the row left the partition it was found in); DutyConnection re-runs it with a
    fresh snapshot, which no longer sees the row."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue(conn, "qw.noop")
        task_id, token = _claim_one(conn)
    retries_before = _moved_row_retries()

    async def scenario() -> list[tuple]:
        mover = psycopg.connect(dsn)  # holds the moving UPDATE open until we commit it
        checkpoints = DutyConnection(dsn, "qw-test-checkpoint")
        try:
            assert _fail_permanently(mover, task_id, token) == [(task_id, token, "failed")]
            save = asyncio.create_task(checkpoints.fetch(lease.SAVE_CHECKPOINT, lease.SaveCheckpointParams(
                id=task_id, token=token, checkpoint='{"page": 2}', progress=None)))
            await asyncio.to_thread(_wait_for_lock_wait, dsn, "qw-test-checkpoint")
            mover.commit()
            return await asyncio.wait_for(save, 10)
        finally:
            mover.close()
            await checkpoints.close()

    assert asyncio.run(scenario()) == [], "the re-run checkpoint no longer finds the failed task running"
    assert _moved_row_retries() == retries_before + 1
    assert _partition_of(dsn, task_id) == "queueworker.tasks_finished"


def test_a_heartbeat_passes_over_a_row_another_transaction_holds_locked(dsn):
    """A failure of a held task is being written (its transaction holds the row) when a heartbeat
    runs: the heartbeat does not wait for it, and reports the lease held but not extended; the next
    one, after the failure committed, no longer finds it."""
    worker = uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue(conn, "qw.noop")
        task_id, token = _claim_one(conn)

    async def scenario() -> tuple[list[tuple], list[tuple]]:
        mover = psycopg.connect(dsn)
        heartbeat = DutyConnection(dsn, "qw-test-heartbeat")
        try:
            assert _fail_permanently(mover, task_id, token) == [(task_id, token, "failed")]
            during = await heartbeat.fetch(lease.HEARTBEAT, _heartbeat_params(worker, task_id, token), timeout=10)
            mover.commit()
            after = await heartbeat.fetch(lease.HEARTBEAT, _heartbeat_params(worker, task_id, token), timeout=10)
            return during, after
        finally:
            mover.close()
            await heartbeat.close()

    during, after = asyncio.run(scenario())
    assert during == [lease.HeldRow(task_id, token, False)]
    assert after == []


@pytest.mark.parametrize("mover", ["success (explicit move)", "failure (routed move)"])
def test_cancel_racing_a_completion_explains_instead_of_failing(dsn, mover):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue(conn, "qw.noop")
        task_id, token = _claim_one(conn)
    with psycopg.connect(dsn) as completer:
        if mover.startswith("success"):
            statements.fetch(completer, lease.COMPLETE_SUCCEEDED, lease.CompleteSucceededParams(
                ids=[task_id], tokens=[token], results=[None]))
        else:
            _fail_permanently(completer, task_id, token)
        cancel = subprocess.Popen([sys.executable, "-m", "queueworker.cli", "cancel", str(task_id), "--dsn", dsn],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for_lock_wait(dsn, "queueworker-cli")
        completer.commit()
    out, err = cancel.communicate(timeout=30)
    assert cancel.returncode != 0
    finished = "succeeded" if mover.startswith("success") else "failed"
    assert f"task {task_id} is {finished}" in err, err
    assert "Traceback" not in err
