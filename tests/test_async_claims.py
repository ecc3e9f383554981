"""Claims committed without waiting for the disk (`async_claim_commit`, on by default), through a
real Postgres crash (integration tier).

A claim is the one statement whose loss in a crash harms nothing: the task is back where it was,
and the lease token the worker holds no longer matches, so its completion is refused and the task
runs again. The test makes the loss certain rather than likely: the WAL writer is stopped (SIGSTOP)
before the claim, so nothing flushes the claim's commit record, then killed (SIGKILL), which makes
the postmaster treat it as a crash: every backend is killed and the server recovers from the WAL
on disk. The same claim with durable commits survives the same crash.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import psycopg
import pytest

from queueworker.db import lease, statements
from queueworker.db.connection import DutyConnection
from queueworker.dev.localpg import LocalPostgres, PostgresNotFound
from queueworker.db.migrate import migrate
from queueworker.client.producer import enqueue_many
from tests.support import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def crashable_dsn():
    """A server of this test's own (durable, as in production), so crashing it disturbs no other test."""
    try:
        server = LocalPostgres(durable=True)
    except PostgresNotFound as exc:
        pytest.fail(str(exc)) if os.environ.get("CI") else pytest.skip(str(exc))
    server.start()
    try:
        migrate(server.dsn)
        yield server.dsn
    finally:
        server.destroy()


def _claim_then_crash(dsn: str, async_commit: bool) -> tuple[int, int]:
    """Claims one task on a duty connection as the worker does (with its asynchronous commit, or
    without), with the WAL writer stopped, then crashes the server. Returns the claimed task's id
    and lease token."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        walwriter, = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'").fetchone()

    async def claim() -> lease.ClaimedRow | None:
        conn = DutyConnection(dsn, "queueworker-duty", prepare=True)
        try:
            claim = lease.ASYNC_COMMIT_CLAIMS[lease.CLAIM] if async_commit else lease.CLAIM
            rows = await conn.fetch(claim, lease.ClaimParams(
                queue="default", limit=1, worker=uuid.uuid4(), lease_seconds=60, timeout_seconds=60))
            return rows[0] if rows else None
        finally:
            await conn.close()

    os.kill(walwriter, signal.SIGSTOP)
    try:
        row = asyncio.run(claim())
    finally:
        os.kill(walwriter, signal.SIGKILL)  # a child killed: the postmaster resets every backend
    assert row is not None
    _wait_for_recovery(dsn)
    return row.id, row.lease_token


def _wait_for_recovery(dsn: str) -> None:
    wait_until(lambda: _recovered(dsn), timeout=60, interval=0.2, message="the server to come back from the crash")


def _recovered(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
            return not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
    except psycopg.OperationalError:
        return False


def _state_and_token(dsn: str, task_id: int) -> tuple[str, int | None]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT state, lease_token FROM queueworker.tasks WHERE id = %s", (task_id,)).fetchone()


def _complete(dsn: str, task_id: int, token: int) -> list:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return statements.fetch(conn, lease.COMPLETE_SUCCEEDED, lease.CompleteSucceededParams(
            ids=[task_id], tokens=[token], results=[None]))


def test_a_claim_lost_in_a_crash_puts_the_task_back_and_fences_its_holder(crashable_dsn):
    with psycopg.connect(crashable_dsn) as conn:
        enqueue_many(conn, [{"task": "t"}])
    task_id, token = _claim_then_crash(crashable_dsn, async_commit=True)
    state, lease_token = _state_and_token(crashable_dsn, task_id)
    assert state == "pending" and lease_token != token, "the claim's commit should have been lost in the crash"
    assert _complete(crashable_dsn, task_id, token) == [], "the holder of a lost claim must not complete the task"
    assert _state_and_token(crashable_dsn, task_id)[0] == "pending"
    with psycopg.connect(crashable_dsn, autocommit=True) as conn:  # and nothing says it ever ran
        transitions = conn.execute("SELECT from_state, to_state FROM queueworker.task_events WHERE task_id = %s "
                                   "ORDER BY id", (task_id,)).fetchall()
    assert ("pending", "running") not in transitions


def test_a_durable_claim_survives_the_same_crash(crashable_dsn):
    with psycopg.connect(crashable_dsn) as conn:
        enqueue_many(conn, [{"task": "t"}])
    task_id, token = _claim_then_crash(crashable_dsn, async_commit=False)
    assert _state_and_token(crashable_dsn, task_id) == ("running", token)
    assert [row[0] for row in _complete(crashable_dsn, task_id, token)] == [task_id]
