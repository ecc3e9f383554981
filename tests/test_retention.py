"""The cleaner keeps every history table bounded, on a real Postgres: finished tasks, finished runs
with their events (once none of their tasks remain), queue events, and watermarks past a retention
of their own; in bounded batches, one worker at a time, through definer functions only the worker
role may run. Old rows are made by moving their timestamps back as the superuser."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from queueworker.client.operations import pause, resume
from queueworker.client.producer import enqueue, start_run
from queueworker.db import statements
from queueworker.db.connection import DutyConnection
from queueworker.db.duties import (
    CLEAN_FINISHED, CLEAN_KEY_STATE, CLEAN_QUEUE_EVENTS, CLEAN_RUNS, CLEAN_WATERMARKS, RetentionParams,
)
from queueworker.runtime import cleaner as cleaner_module
from queueworker.runtime.cleaner import Cleaned, Cleaner
from tests.support import WorkerProcess, query, scalar, wait_until
from tests.test_roles import installation  # noqa: F401  (the fixture: a login per role of docs/database-roles.sql)

pytestmark = pytest.mark.integration

HOUR = 3600
DAY = 24 * HOUR
PARTITION = {"task": "p", "queue": "retention"}
FUNCTIONS = ("clean_finished", "clean_runs", "clean_queue_events", "clean_watermarks", "clean_key_state")
CLEANER_STATEMENTS = (CLEAN_FINISHED, CLEAN_RUNS, CLEAN_QUEUE_EVENTS, CLEAN_WATERMARKS, CLEAN_KEY_STATE)


def end_run_tasks(conn: psycopg.Connection, run_id: int, state: str, ago: str) -> None:
    """Ends the run's pending tasks `ago` (an interval) ago; the update trigger counts them, so the
    run moves on as a worker's completions would move it."""
    conn.execute("UPDATE queueworker.tasks SET state = %s, finished_at = now() - %s::interval "
                 "WHERE run_id = %s AND state = 'pending'", (state, ago, run_id))


def age_runs(conn: psycopg.Connection, run_ids: list[int], ago: str) -> None:
    conn.execute("UPDATE queueworker.runs SET started_at = now() - %s::interval - interval '1 minute', "
                 "finished_at = CASE WHEN state <> 'running' THEN now() - %s::interval END WHERE id = ANY(%s)",
                 (ago, ago, run_ids))


def age_watermark(conn: psycopg.Connection, name: str, ago: str) -> None:
    conn.execute("UPDATE queueworker.watermarks SET updated_at = now() - %s::interval WHERE name = %s", (ago, name))


def age_queue_events(conn: psycopg.Connection, queue: str, ago: str) -> None:
    """queue_events is append-only (a trigger refuses updates): the superuser moves the clock back
    with the triggers off for its own session."""
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute("UPDATE queueworker.queue_events SET at = now() - %s::interval WHERE queue = %s", (ago, queue))


def clean(dsn: str, retention_seconds: float, watermark_retention_seconds: float) -> Cleaned:
    async def once() -> Cleaned:
        connection = DutyConnection(dsn, "retention-test")
        try:
            return await Cleaner(connection, retention_seconds, watermark_retention_seconds, interval=300).clean_once()
        finally:
            await connection.close()

    return asyncio.run(once())


def run_ids(dsn: str) -> set[int]:
    return {row[0] for row in query(dsn, "SELECT id FROM queueworker.runs")}


def run_event_owners(dsn: str) -> set[int]:
    return {row[0] for row in query(dsn, "SELECT DISTINCT run_id FROM queueworker.run_events")}


def watermarks(dsn: str) -> set[str]:
    return {row[0] for row in query(dsn, "SELECT name FROM queueworker.watermarks")}


def test_each_kind_of_history_goes_once_older_than_its_retention_and_stays_while_young(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        done = start_run(conn, "done", [PARTITION] * 2)
        failed = start_run(conn, "failed", [PARTITION])
        alerted = start_run(conn, "alerted", [PARTITION], on_failure={"task": "alert", "queue": "retention"})
        young = start_run(conn, "young", [PARTITION])
        running = start_run(conn, "running", [PARTITION], watermark="w-busy")
        marked = start_run(conn, "marked", [PARTITION], watermark="w-fresh")
        stale = start_run(conn, "stale", [PARTITION], watermark="w-stale")
        for run_id in (done, marked, stale):
            end_run_tasks(conn, run_id, "succeeded", "2 hours")
        for run_id in (failed, alerted):
            end_run_tasks(conn, run_id, "failed", "2 hours")  # alerted's alert waits, pending
        end_run_tasks(conn, young, "succeeded", "0 seconds")
        age_runs(conn, [done, failed, alerted, running, marked, stale], "2 hours")
        # w-busy was advanced long ago, and the run that will advance it again is running.
        conn.execute("INSERT INTO queueworker.watermarks (name, value, updated_at) "
                     "VALUES ('w-busy', '\"2025-01-01\"', now() - interval '2 days')")
        age_watermark(conn, "w-stale", "2 days")
        pause(conn, "q-old")
        resume(conn, "q-old")
        age_queue_events(conn, "q-old", "2 hours")
        pause(conn, "q-young")
        tasks_before = scalar(dsn, "SELECT count(*) FROM queueworker.tasks")
        alert = scalar(dsn, "SELECT failure_task_id FROM queueworker.runs WHERE id = %s", (alerted,))
    assert query(dsn, "SELECT id, state::text FROM queueworker.runs ORDER BY id") == [
        (done, "succeeded"), (failed, "failed"), (alerted, "failed"), (young, "succeeded"),
        (running, "running"), (marked, "succeeded"), (stale, "succeeded")]

    cleaned = clean(dsn, retention_seconds=HOUR, watermark_retention_seconds=DAY)

    assert cleaned == Cleaned(tasks=6, runs=3, queue_events=2, watermarks=("w-stale",))
    kept = {alerted, young, running, marked}
    assert run_ids(dsn) == kept, "old finished runs went; one with a task left, a young one, a running one " \
                                 "and the one a watermark names stayed"
    assert run_event_owners(dsn) == kept, "a run's events went with it"
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks") == tasks_before - 6
    assert query(dsn, "SELECT id FROM queueworker.tasks WHERE run_id = %s", (alerted,)) == [(alert,)]
    assert watermarks(dsn) == {"w-busy", "w-fresh"}, "the stale one went; a running run's and a young one stayed"
    assert query(dsn, "SELECT queue, change FROM queueworker.queue_events ORDER BY id") == [("q-young", "paused")]
    assert scalar(dsn, "SELECT paused_until = 'infinity' FROM queueworker.queues WHERE name = 'q-young'")

    assert clean(dsn, retention_seconds=HOUR, watermark_retention_seconds=DAY) == Cleaned(), "nothing left to go"
    # The alert ends, and goes past the retention: then its run goes too.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() - interval '2 hours' "
                     "WHERE id = %s", (alert,))
    assert clean(dsn, retention_seconds=HOUR, watermark_retention_seconds=DAY) == Cleaned(tasks=1, runs=1)
    assert run_ids(dsn) == {young, running, marked}


@pytest.mark.parametrize("retention_seconds, watermark_retention_seconds", [(HOUR, 0), (0, DAY)])
def test_a_retention_of_zero_keeps_what_it_bounds(dsn, retention_seconds, watermark_retention_seconds):
    """`--watermark-retention-days 0` keeps every watermark (and so the run each names) while the
    rest of the history goes; `--retention-hours 0` keeps the rest while stale watermarks go."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        stale = start_run(conn, "stale", [PARTITION], watermark="w-stale")
        end_run_tasks(conn, stale, "succeeded", "2 days")
        age_runs(conn, [stale], "2 days")
        age_watermark(conn, "w-stale", "2 days")
        pause(conn, "q-old")
        age_queue_events(conn, "q-old", "2 days")

    cleaned = clean(dsn, retention_seconds, watermark_retention_seconds)

    if watermark_retention_seconds:
        assert cleaned == Cleaned(watermarks=("w-stale",))
        assert watermarks(dsn) == set() and run_ids(dsn) == {stale}
        assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks") == 1
        assert scalar(dsn, "SELECT count(*) FROM queueworker.queue_events") == 1
    else:
        assert cleaned == Cleaned(tasks=1, queue_events=1)
        assert watermarks(dsn) == {"w-stale"}
        assert run_ids(dsn) == {stale}, "the run the kept watermark names stays"


def test_each_statement_deletes_at_most_its_batch_and_the_cleaner_repeats_until_none_is_left(dsn, monkeypatch):
    with psycopg.connect(dsn, autocommit=True) as conn:
        for n in range(5):
            end_run_tasks(conn, start_run(conn, f"run-{n}", [PARTITION]), "succeeded", "2 days")
            conn.execute("INSERT INTO queueworker.watermarks (name, value, updated_at) "
                         "VALUES (%s, '1', now() - interval '2 days')", (f"w-{n}",))
            pause(conn, f"q-{n}")
            age_queue_events(conn, f"q-{n}", "2 days")
        age_runs(conn, list(run_ids(dsn)), "2 days")
        params = RetentionParams(retention_seconds=DAY, limit=2)
        deleted = [len(statements.fetch(conn, statement, params))
                   for statement in (CLEAN_FINISHED, CLEAN_FINISHED, CLEAN_RUNS, CLEAN_WATERMARKS, CLEAN_QUEUE_EVENTS)]
    assert deleted == [2, 2, 2, 2, 2], "each at most its batch, of the 4 runs whose tasks are gone too"

    monkeypatch.setattr(cleaner_module, "BATCH", 2)
    cleaned = clean(dsn, retention_seconds=DAY, watermark_retention_seconds=DAY)

    assert (cleaned.tasks, cleaned.runs, cleaned.queue_events, len(cleaned.watermarks)) == (1, 3, 3, 3)
    assert run_ids(dsn) == set() and watermarks(dsn) == set()
    assert scalar(dsn, "SELECT count(*) FROM queueworker.queue_events") == 0


def test_a_worker_that_keeps_history_forever_still_bounds_its_watermarks(dsn):
    """`--retention-hours 0` turns off the deletion of history, not the cleaner: stale watermarks
    still go."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        stale = start_run(conn, "stale", [PARTITION], watermark="w-stale")
        end_run_tasks(conn, stale, "succeeded", "2 days")
        age_runs(conn, [stale], "2 days")
        age_watermark(conn, "w-stale", "2 days")
    worker = WorkerProcess(dsn, "--queue", "retention-idle", "--retention-hours", "0",
                           "--watermark-retention-days", "1", "--cleaner-interval-seconds", "0.2")
    try:
        wait_until(lambda: watermarks(dsn) == set(), message="the stale watermark deleted")
    finally:
        worker.stop()
    assert run_ids(dsn) == {stale} and scalar(dsn, "SELECT count(*) FROM queueworker.tasks") == 1


@pytest.mark.parametrize("retention_seconds, limit, problem", [
    (-1.0, 100, "a retention is 0 to 2147483647 seconds, not -1"),
    (float("nan"), 100, "a retention is 0 to 2147483647 seconds, not NaN"),
    (float("inf"), 100, "a retention is 0 to 2147483647 seconds, not Infinity"),
    (2.0 ** 31, 100, "a retention is 0 to 2147483647 seconds, not 2147483648"),
    (HOUR, 0, "a retention batch is 1 to 100000 rows, not 0"),
    (HOUR, -5, "a retention batch is 1 to 100000 rows, not -5"),
    (HOUR, 100_001, "a retention batch is 1 to 100000 rows, not 100001"),
])
def test_a_bad_retention_or_batch_is_refused_in_one_line_and_deletes_nothing(dsn, retention_seconds, limit, problem):
    with psycopg.connect(dsn, autocommit=True) as conn:
        old = enqueue(conn, "qw.noop")
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() - interval '2 days' "
                     "WHERE id = %s", (old,))
        for statement in CLEANER_STATEMENTS:
            with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
                statements.fetch(conn, statement, RetentionParams(retention_seconds=retention_seconds, limit=limit))
            assert refused.value.diag.message_primary == problem, statement.name
    assert query(dsn, "SELECT id FROM queueworker.tasks") == [(old,)]


def test_one_worker_at_a_time_deletes_each_kind(dsn):
    """While another worker holds a statement's row of duty_locks, the statement deletes nothing
    (and does not wait); once the row is free, it deletes."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        stale = start_run(conn, "stale", [PARTITION], watermark="w-stale")
        end_run_tasks(conn, stale, "succeeded", "2 days")
        age_runs(conn, [stale], "2 days")
        age_watermark(conn, "w-stale", "2 days")
        pause(conn, "q-old")
        age_queue_events(conn, "q-old", "2 days")
    params = RetentionParams(retention_seconds=DAY, limit=100)
    with psycopg.connect(dsn, autocommit=True) as holder, psycopg.connect(dsn, autocommit=True) as conn:
        for duty, statement in (("clean_finished", CLEAN_FINISHED), ("clean_watermarks", CLEAN_WATERMARKS),
                                ("clean_runs", CLEAN_RUNS), ("clean_queue_events", CLEAN_QUEUE_EVENTS)):
            with holder.transaction():
                holder.execute("SELECT FROM queueworker.duty_locks WHERE duty = %s FOR NO KEY UPDATE", (duty,))
                assert statements.fetch(conn, statement, params) == [], statement.name
            assert len(statements.fetch(conn, statement, params)) == 1, statement.name


def test_the_worker_role_cleans_history_in_a_real_worker_and_no_other_role_may(installation):  # noqa: F811
    admin, login = installation.admin, installation.logins
    installation.install()
    with psycopg.connect(login["producer"], autocommit=True) as conn:
        stale = start_run(conn, "stale", [PARTITION], watermark="w-stale")
        young = start_run(conn, "young", [PARTITION])
    with psycopg.connect(login["operator"], autocommit=True) as conn:
        pause(conn, "q-old")
    with psycopg.connect(admin, autocommit=True) as conn:
        end_run_tasks(conn, stale, "succeeded", "2 days")
        age_runs(conn, [stale], "2 days")
        age_watermark(conn, "w-stale", "2 days")
        age_queue_events(conn, "q-old", "2 days")

    # Every role but the worker is refused the retention functions, and the worker deletes nothing
    # itself.
    refused = [(group, f"SELECT * FROM queueworker.{function}(0, 100)")
               for group in ("producer", "controller", "operator") for function in FUNCTIONS]
    refused += [("worker", f"DELETE FROM queueworker.{table}")
                for table in ("runs", "run_events", "queue_events", "watermarks", "duty_locks")]
    refused += [("worker", "SELECT queueworker.retention_cutoff(0, 100)")]
    allowed = []
    for group, statement in refused:
        with psycopg.connect(login[group], autocommit=True) as conn:
            try:
                conn.execute(statement)
            except psycopg.errors.InsufficientPrivilege:
                continue
            allowed.append((group, statement))
    assert allowed == []
    assert run_ids(admin) == {stale, young} and watermarks(admin) == {"w-stale"}

    # A worker with the watermarks kept forever: the rest of the old history goes.
    keeping = WorkerProcess(login["worker"], "--queue", "retention-idle", "--retention-hours", "1",
                            "--watermark-retention-days", "0", "--cleaner-interval-seconds", "0.2")
    try:
        wait_until(lambda: "deleted 1 finished tasks, 0 finished runs and 1 queue events" in keeping.log(),
                   message="the cleaner's pass")
    finally:
        keeping.stop()
    assert watermarks(admin) == {"w-stale"} and run_ids(admin) == {stale, young}
    assert scalar(admin, "SELECT count(*) FROM queueworker.queue_events") == 0

    # A worker that keeps watermarks 1 day: the stale one goes, then the run it named.
    bounding = WorkerProcess(login["worker"], "--queue", "retention-idle", "--retention-hours", "1",
                             "--watermark-retention-days", "1", "--cleaner-interval-seconds", "0.2")
    try:
        # The pass reports what it deleted once it is over: the log line comes after the deletes.
        wait_until(lambda: run_ids(admin) == {young} and "deleted 1 watermarks" in bounding.log(),
                   message="the stale watermark's run deleted, and the pass's report")
    finally:
        bounding.stop()
    log = bounding.log()
    assert "deleted 1 watermarks not advanced within the watermark retention" in log and "'w-stale'" in log, log
    assert "permission denied" not in log, log
    assert watermarks(admin) == set() and run_event_owners(admin) == {young}

