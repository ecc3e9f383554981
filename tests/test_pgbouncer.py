"""Workers, producers, the CLI and the controller's reads through a PgBouncer in transaction
pooling mode, with few server connections shared by every client (integration tier).

Nothing may rely on session state there: a prepared statement, a LISTEN, a session-level advisory
lock or setting lands on a server connection other clients get next. Notifications never arrive,
so workers and the controller find that out and poll.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import psycopg
import pytest

from queueworker.db import connection as db
from queueworker.db.migration import SCHEMA_VERSION
from queueworker.db.statements import NO_PARAMS, NoParams, Statement

from queueworker import wait_for
from queueworker.runtime.cron import POLL_SECONDS, SAFETY_POLL_SECONDS
from queueworker.db.notify import notifications_arrive
from queueworker.db.migrate import available_migrations, migrate
from queueworker.client.producer import enqueue, enqueue_many
from queueworker.settings import WorkerSettings
from queueworker.runtime.worker import Worker
from queueworker_controller.queuedb import QueueDatabases
from tests.support import (
    WorkerProcess, assert_each_succeeded_once, builtin_registry, query, scalar, state_counts, until,
    wait_until)

pytestmark = pytest.mark.integration

POLLING = "notifications do not reach this worker"
# A long lease: heartbeats (a third of it) are far apart, so a cancellation that reaches a worker
# sooner came by the listener's polling, not by a heartbeat finding the lease gone.
SLOW_HEARTBEATS = ["--lease-seconds", "600"]


class PreparedRow(NamedTuple):
    prepared: int


# How many statements the connection has prepared (a test's own statement, run as the worker's are).
PREPARED = Statement("test.prepared", "SELECT count(*) AS prepared FROM pg_prepared_statements", NoParams, PreparedRow)


def qw(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queueworker.cli", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def workers():
    started: list[WorkerProcess] = []

    def start(dsn: str, *args: str) -> WorkerProcess:
        proc = WorkerProcess(dsn, "--poll-interval-seconds", "0.5", *args)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def test_statements_are_never_prepared_on_shared_server_connections(pgbouncer_dsn):
    """Three clients take turns on three server connections, each running the same statements
    more often than psycopg's threshold for preparing them. A psycopg connection with its default
    threshold meets another client's prepared statement (so this setup catches preparing); those
    queueworker opens (asked to prepare, as a worker's are), and the statements it runs on an
    application's connection, never do."""
    async def duty_connections() -> None:
        conns = [db.DutyConnection(pgbouncer_dsn, f"queueworker-test-{i}", prepare=True) for i in range(3)]
        try:
            for _ in range(20):
                for conn in conns:
                    assert await conn.fetch(SCHEMA_VERSION, NO_PARAMS) == [(available_migrations()[-1].version,)]
        finally:
            for conn in conns:
                await conn.close()
    asyncio.run(duty_connections())

    applications = [psycopg.connect(pgbouncer_dsn, autocommit=True) for _ in range(2)]
    try:
        for _ in range(10):
            for conn in applications:
                enqueue(conn, "qw.noop")  # a producer on the application's own connection
        assert scalar(pgbouncer_dsn, "SELECT count(*) FROM queueworker.tasks") == 20
        with pytest.raises(psycopg.Error, match="prepared statement"):
            for _ in range(10):
                for conn in applications:
                    conn.execute("SELECT count(*) FROM queueworker.tasks WHERE id > %s", (0,))
    finally:
        for conn in applications:
            conn.close()


def test_a_workers_connections_prepare_their_statements_on_a_direct_connection(dsn):
    """The counterpart of the test above: straight to Postgres, a worker's connections prepare
    what they run more than once (planning the claim each time costs the server ~0.6 ms), unless
    --no-prepare-statements says otherwise."""
    async def prepared_after_two_runs(settings: WorkerSettings) -> int:
        worker = Worker(dsn, settings, builtin_registry())
        conns = worker._connections()
        try:
            for conn in conns:
                for _ in range(2):
                    await conn.fetch(SCHEMA_VERSION, NO_PARAMS)
            return min([(await conn.fetch(PREPARED, NO_PARAMS))[0].prepared for conn in conns])
        finally:
            for conn in conns:
                await conn.close()
    assert asyncio.run(prepared_after_two_runs(WorkerSettings())) >= 1
    assert asyncio.run(prepared_after_two_runs(WorkerSettings(prepare_statements=False))) == 0


def test_two_migrators_at_once_apply_every_migration_once_and_leave_no_lock(pgbouncer_blank_dsn, blank_dsn):
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(migrate, pgbouncer_blank_dsn) for _ in range(2)]
        applied = sorted(([m.version for m in run.result(timeout=120)] for run in runs), key=len)
    assert applied == [[], [m.version for m in available_migrations()]]
    assert scalar(blank_dsn, "SELECT count(*) FROM queueworker.schema_migrations") == len(available_migrations())
    assert scalar(blank_dsn, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
    assert qw("migrate", "--dsn", pgbouncer_blank_dsn).returncode == 0  # the CLI too: nothing left


def test_workers_drain_tasks_exactly_once_and_promote_retries_and_delays(pgbouncer_dsn, dsn, workers):
    """Three worker processes: two told not to listen, one that finds out by itself. Plain tasks,
    from the CLI and from an application, succeed exactly once; delayed ones and retries are promoted by polling schedulers; an
    application waiting for a task (without LISTEN) sees it finish."""
    enqueued = qw("enqueue", "qw.noop", "--count", "20", "--dsn", pgbouncer_dsn)
    assert enqueued.returncode == 0, enqueued.stderr
    with psycopg.connect(pgbouncer_dsn, autocommit=True) as conn:
        enqueue_many(conn, [{"task": "qw.noop"}] * 280)
        delayed = enqueue_many(conn, [{"task": "qw.noop", "delay": 2}] * 5)
        failing = enqueue_many(conn, [{"task": "qw.fail", "max_attempts": 3}] * 3)
        procs = [workers(pgbouncer_dsn, "--no-listen", "--retry-base-seconds", "0.2", "--concurrency", "5")
                 for _ in range(2)]
        procs.append(workers(pgbouncer_dsn, "--retry-base-seconds", "0.2", "--concurrency", "5"))
        finished = wait_for(conn, delayed[0], timeout=120, listen=False)
        assert finished.state == "succeeded"
    wait_until(lambda: state_counts(dsn).get("succeeded") == 305 and state_counts(dsn).get("failed") == 3,
               timeout=120, message="every task finished")
    noops = [row[0] for row in query(dsn, "SELECT id FROM queueworker.tasks WHERE task = 'qw.noop'")]
    assert len(noops) == 305
    assert_each_succeeded_once(dsn, noops)
    assert query(dsn, "SELECT attempts FROM queueworker.tasks WHERE id = ANY(%s)", (failing,)) == [(3,)] * 3
    assert scalar(dsn, """SELECT count(DISTINCT worker) FROM queueworker.task_events
                          WHERE to_state = 'running'""") >= 2, "the work was not shared between worker processes"
    wait_until(lambda: POLLING in procs[2].log(), timeout=60, message="the listening worker to fall back to polling")
    assert all(POLLING not in proc.log() for proc in procs[:2])  # told not to listen: no check
    assert "refuses startup options" in procs[0].log()
    for proc in procs:
        proc.signal(signal.SIGTERM)
    assert [proc.wait(60) for proc in procs] == [0, 0, 0], procs[0].log()
    assert scalar(dsn, "SELECT count(*) FROM queueworker.workers") == 0


def test_cli_cancel_reaches_the_polling_worker_and_status_and_retry_work(pgbouncer_dsn, dsn, workers):
    with psycopg.connect(pgbouncer_dsn, autocommit=True) as conn:
        task_id = enqueue(conn, "qw.sleep", {"seconds": 3600})
    proc = workers(pgbouncer_dsn, "--no-listen", *SLOW_HEARTBEATS)
    wait_until(lambda: state_counts(dsn).get("running") == 1, timeout=60, message="the task running")
    status = json.loads(qw("status", "--json", "--dsn", pgbouncer_dsn).stdout)
    assert status["queues"]["default"]["running"] == 1 and len(status["workers"]) == 1
    cancelled = qw("cancel", str(task_id), "--dsn", pgbouncer_dsn)
    assert cancelled.returncode == 0, cancelled.stderr
    # Well before the next heartbeat (200 s away), the worker stopped the handler.
    wait_until(lambda: "the task was cancelled" in proc.log(), timeout=60, message="the worker to stop the handler")
    assert scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (task_id,)) == "cancelled"
    retried = qw("retry", str(task_id), "--dsn", pgbouncer_dsn)
    assert retried.returncode == 0, retried.stderr
    wait_until(lambda: state_counts(dsn).get("running") == 1, timeout=60, message="the retried task running again")
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.log()


def test_the_listen_check_fails_through_pgbouncer_and_passes_on_a_direct_connection(pgbouncer_dsn, dsn):
    async def check(url: str) -> bool:
        conn = await db.connect(url, "queueworker-test-listen")
        sender = db.DutyConnection(url, "queueworker-test-notify")
        try:
            return await notifications_arrive(conn, sender.execute)
        finally:
            await conn.close()
            await sender.close()
    assert asyncio.run(check(pgbouncer_dsn)) is False
    assert asyncio.run(check(dsn)) is True


def test_a_worker_that_hears_of_no_schedule_change_has_its_cron_duty_poll(pgbouncer_dsn):
    """The cron duty of a worker that expects to listen sleeps for its long safety poll; once the
    listener has found that notifications do not arrive, it wakes the duty, which from then on looks
    for schedule changes every POLL_SECONDS. With --no-listen it does so from the start."""
    async def duty_waits(settings: WorkerSettings) -> list[float]:
        worker = Worker(pgbouncer_dsn, settings, builtin_registry())
        try:
            waits = [await worker.cron.step()]
            if settings.listen:
                await worker.listener.step()  # the check: nothing arrives
                assert worker.listener.polling and worker.cron.wake.is_set()
                waits.append(await worker.cron.step())
            return waits
        finally:
            for conn in worker._connections():
                await conn.close()

    assert asyncio.run(duty_waits(WorkerSettings())) == [SAFETY_POLL_SECONDS, POLL_SECONDS]
    assert asyncio.run(duty_waits(WorkerSettings(listen=False))) == [POLL_SECONDS]


def test_a_worker_on_a_direct_connection_keeps_listening(dsn, caplog):
    """The listener's check passes, it listens, and a task enqueued afterwards wakes the worker."""
    caplog.set_level(logging.WARNING, logger="queueworker.listener")

    async def listen() -> None:
        worker = Worker(dsn, WorkerSettings(), builtin_registry())
        listening = asyncio.create_task(worker.listener.step())
        try:
            await asyncio.wait_for(worker.scheduler.poked.wait(), 30)  # caught up: it listens now
            woken = worker.signals.woken.expect()
            with psycopg.connect(dsn, autocommit=True) as conn:
                enqueue(conn, "qw.noop")
            await asyncio.wait_for(woken, 30)
            assert not worker.listener.polling and not listening.done()
        finally:
            listening.cancel()
            for conn in worker._connections():
                await conn.close()
    asyncio.run(listen())
    assert not any(POLLING in record.getMessage() for record in caplog.records)


def test_the_controller_reads_queues_through_pgbouncer_and_knows_it_must_poll(pgbouncer_dsn, dsn):
    with psycopg.connect(pgbouncer_dsn, autocommit=True) as conn:
        enqueue_many(conn, [{"task": "qw.noop", "queue": "reports"}] * 7)

    async def read(databases: QueueDatabases) -> None:
        databases.bind("through-pgbouncer", pgbouncer_dsn, "reports")
        databases.bind("direct", dsn, "reports")
        for _ in range(10):  # more often than psycopg's threshold for preparing a statement
            depth = await databases.depth(pgbouncer_dsn, "reports", 100, lookahead_seconds=60, throughput=True)
            assert depth.ready == 7
            assert await databases.worker_leases(pgbouncer_dsn, "default", "reports") == []
        checked = databases._databases[pgbouncer_dsn]._listener
        await asyncio.wait_for(asyncio.shield(checked), 60)  # the check ended it: nothing to listen to
        assert not databases.listening(pgbouncer_dsn)
        await until(lambda: databases.listening(dsn), 60, "the direct database's listener to listen", interval=0.1)
        assert databases.listening(dsn)

    async def main() -> None:
        databases = QueueDatabases()
        try:
            await read(databases)
        finally:
            databases.close()
    asyncio.run(main())
