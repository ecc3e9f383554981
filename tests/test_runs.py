"""Partitioned runs (seed 003): exact fan-in in the statements that record outcomes, the
consolidation enqueued once and only if every partition succeeded, the alert once on failure,
the watermark advanced only by a successful run. Against a real Postgres, with real worker
processes killed and a Postgres restart."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid

import psycopg
import pytest

from queueworker import RunInfo, enqueue, jsonvalue
from queueworker.client import runs
from queueworker.client.producer import start_run
from queueworker.db import statements
from queueworker.db.lease import (
    CLAIM, COMPLETE_FAILED, COMPLETE_SUCCEEDED, ClaimParams, CompleteFailedParams, CompleteSucceededParams)
from queueworker.db.runs import RunRow
from queueworker.db.tasks import RETRY_TASK, TaskParams
from tests.support import FAST_LEASES, WorkerProcess, query, scalar, wait_until

pytestmark = pytest.mark.integration


def run_row(dsn: str, run_id: int) -> RunRow:
    with psycopg.connect(dsn) as conn:
        return runs.run(conn, run_id)


def claimed(conn, queue: str, limit: int = 100) -> list:
    return statements.fetch(conn, CLAIM, ClaimParams(queue=queue, worker=uuid.uuid4(), lease_seconds=30,
                                                     timeout_seconds=60, limit=limit))


def claim(conn, queue: str) -> dict[int, int]:
    return {row.id: row.lease_token for row in claimed(conn, queue)}


def succeed(conn, tokens: dict[int, int]) -> None:
    statements.fetch(conn, COMPLETE_SUCCEEDED, CompleteSucceededParams(
        ids=list(tokens), tokens=list(tokens.values()), results=[None] * len(tokens)))


def fail(conn, task_id: int, token: int) -> None:
    statements.fetch(conn, COMPLETE_FAILED, CompleteFailedParams(
        ids=[task_id], tokens=[token], retryables=[False], backoffs=[0.0],
        errors=[jsonvalue.encode({"message": "source down"})]))


def run_tasks(dsn: str, run_id: int) -> list[tuple]:
    """(id, partition, state) of the run's tasks, partitions first."""
    return query(dsn, "SELECT id, run_partition, state::text FROM queueworker.tasks WHERE run_id = %s "
                      "ORDER BY run_partition NULLS LAST, id", (run_id,))


def test_fan_in_is_exact_and_the_consolidation_is_enqueued_once_then_advances_the_watermark(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        run_id = start_run(conn, "export", [{"task": "export.part", "queue": "parts", "payload": {"p": i}}
                                            for i in range(5)],
                           on_success={"task": "export.consolidate", "queue": "final"}, watermark="export")
        tokens = claim(conn, "parts")
        first, rest = dict(list(tokens.items())[:2]), dict(list(tokens.items())[2:])
        succeed(conn, first)  # outcomes arrive in batches of any size
        assert (run_row(dsn, run_id).succeeded, claim(conn, "final")) == (2, {})
        succeed(conn, rest)
        run = run_row(dsn, run_id)
        assert (run.state, run.succeeded, run.success_task_id is not None) == ("running", 5, True)
        assert [t[1:] for t in run_tasks(dsn, run_id)] == [(i, "succeeded") for i in range(5)] + [(None, "pending")]
        assert scalar(dsn, "SELECT count(*) FROM queueworker.watermarks") == 0, "not before the consolidation"
        succeed(conn, claim(conn, "final"))
    run = run_row(dsn, run_id)
    assert run.state == "succeeded" and run.watermark_before_json is None and run.watermark_after_json is not None
    assert query(dsn, "SELECT value::text, run_id FROM queueworker.watermarks WHERE name = 'export'") == [
        (run.watermark_after_json, run_id)]

    with psycopg.connect(dsn, autocommit=True) as conn:  # the next run sees the watermark as it stands
        second = start_run(conn, "export", [{"task": "export.part"}], watermark="export")
    assert run_row(dsn, second).watermark_before_json == run.watermark_after_json


def test_a_failed_partition_fails_the_run_alerts_once_and_a_retry_brings_the_consolidation(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        run_id = start_run(conn, "scrape", [{"task": "scrape", "queue": "parts"} for _ in range(3)],
                           on_success={"task": "consolidate", "queue": "final"},
                           on_failure={"task": "alert", "queue": "alerts"}, watermark="scrape")
        tokens = claim(conn, "parts")
        (bad, bad_token), *good = tokens.items()
        fail(conn, bad, bad_token)
        succeed(conn, dict(good))
        run = run_row(dsn, run_id)
        assert (run.state, run.succeeded, run.failed, run.success_task_id) == ("failed", 2, 1, None)
        assert len(claim(conn, "alerts")) == 1 and claim(conn, "final") == {}, "alerted once, no consolidation"

        statements.fetch(conn, RETRY_TASK, TaskParams(id=bad))
        assert (run_row(dsn, run_id).state, run_row(dsn, run_id).failed) == ("running", 0)
        succeed(conn, claim(conn, "parts"))
        consolidation = claim(conn, "final")
        assert len(consolidation) == 1
        succeed(conn, consolidation)
    run = run_row(dsn, run_id)
    assert (run.state, run.succeeded, run.failed) == ("succeeded", 3, 0)
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE run_id = %s AND run_partition IS NULL",
                  (run_id,)) == 2, "one alert, one consolidation"


def test_a_failed_consolidation_fails_the_run_and_keeps_the_watermark(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        run_id = start_run(conn, "load", [{"task": "p", "queue": "parts"}],
                           on_success={"task": "consolidate", "queue": "final"}, watermark="load")
        succeed(conn, claim(conn, "parts"))
        (task_id, token), = claim(conn, "final").items()
        fail(conn, task_id, token)
    assert run_row(dsn, run_id).state == "failed"
    assert scalar(dsn, "SELECT count(*) FROM queueworker.watermarks") == 0


def test_a_claim_tells_partitions_and_the_consolidation_their_run(dsn):
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO queueworker.watermarks (name, value) VALUES ('orders', '\"2026-01-01\"')")
        run_id = start_run(conn, "orders", [{"task": "p", "queue": "r"}] * 2, on_success={"task": "c", "queue": "r"},
                           watermark="orders")
        enqueue(conn, "plain", queue="r", priority=-1)
        rows = claimed(conn, "r", limit=10)
        partitions = sorted((RunInfo.from_json(row.run_json) for row in rows if row.task == "p"),
                            key=lambda run: run.partition)
        assert partitions == [RunInfo(run_id, "orders", index, "orders", "2026-01-01", False) for index in (0, 1)]
        assert [row.run_json for row in rows if row.task == "plain"] == [None], "tasks outside a run pay nothing"
        succeed(conn, {row.id: row.lease_token for row in rows if row.task == "p"})
        consolidation, = claimed(conn, "r", limit=10)
        assert RunInfo.from_json(consolidation.run_json) == RunInfo(run_id, "orders", None, "orders", "2026-01-01",
                                                                    False)


def test_a_watermark_python_cannot_read_fails_only_the_runs_tasks(dsn):
    deep = "[" * 3000 + "]" * 3000
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO queueworker.watermarks (name, value) VALUES ('deep', %s::jsonb)", (deep,))
        run_id = start_run(conn, "deep", [{"task": "qw.noop", "queue": "wm"}], watermark="deep")
        plain = enqueue(conn, "qw.noop", queue="wm")
    worker = WorkerProcess(dsn, "--queue", "wm")
    try:
        wait_until(lambda: run_row(dsn, run_id).state == "failed", message="the run to fail")
        wait_until(lambda: scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (plain,))
                   == "succeeded", message="the plain task to succeed")
    finally:
        worker.stop()
    (state, message), = query(dsn, "SELECT state::text, error ->> 'message' FROM queueworker.tasks "
                                   "WHERE run_id = %s", (run_id,))
    assert state == "failed" and message.startswith("the run's watermark cannot be decoded: nested too deeply"), message
    shown = qw(dsn, "run", "show", str(run_id))
    assert shown.returncode == 0 and "(before [[[[" in shown.stdout and "(6,000 characters)" in shown.stdout, shown
    listed, = json.loads(qw(dsn, "runs", "--json").stdout)
    assert listed["watermark_before_json"] == deep and listed["watermark_after"] is None


def test_bad_runs_are_refused():
    with pytest.raises(ValueError, match="at least one partition"):
        start_run(None, "empty", [])
    with pytest.raises(ValueError, match="on_success/on_failure task takes"):
        start_run(None, "x", [{"task": "p"}], on_success={"task": "c", "depends_on": [1]})
    with pytest.raises(ValueError, match="partitions cannot be unique tasks"):  # duplicates would never be counted
        start_run(None, "dupes", [{"task": "p", "dedupe": "spec"}, {"task": "p", "dedupe": "spec"}])


ENQUEUE_PARTITIONS = ("SELECT * FROM queueworker.enqueue_tasks(%(queues)s, %(tasks)s, %(payloads)s::jsonb[], "
                      "%(zeros)s, '{}', %(ones)s, '{}', %(keys)s, '{}', '{}', '{}', '{}', %(runs)s, %(partitions)s)")


@pytest.mark.parametrize("partitions, keys", [
    ([0, 1], [None, None]),  # two partitions for a run that expects one
    ([0, 0], [None, None]),  # one partition twice
    ([-1], [None]),
    ([None], [None]),
    ([0], ["k"]),  # a unique task
], ids=["beyond-expected", "twice", "negative", "none", "unique"])
def test_the_database_refuses_partitions_a_run_cannot_count(dsn, partitions, keys):
    """Through the producer's SQL function as any other language would call it. Such a task once made
    every rescue fail (more outcomes than the run expects), for every queue."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        run_id = conn.execute("SELECT queueworker.start_run('small', 1, NULL, NULL, NULL)").fetchone()[0]
        n = len(partitions)
        params = {"queues": ["q"] * n, "tasks": ["p"] * n, "payloads": ["{}"] * n, "zeros": [0] * n, "ones": [1] * n,
                  "keys": keys, "runs": [run_id] * n, "partitions": partitions}
        with pytest.raises(psycopg.errors.CheckViolation, match="not a partition its run can count"):
            conn.execute(ENQUEUE_PARTITIONS, params)
        conn.execute(ENQUEUE_PARTITIONS, {**params, "queues": ["q"], "tasks": ["p"], "payloads": ["{}"], "zeros": [0],
                                          "ones": [1], "keys": [None], "runs": [run_id], "partitions": [0]})
        with pytest.raises(psycopg.errors.CheckViolation, match=f"run {run_id}, partition 0"):  # again, later
            conn.execute(ENQUEUE_PARTITIONS, {**params, "queues": ["q"], "tasks": ["p"], "payloads": ["{}"],
                                              "zeros": [0], "ones": [1], "keys": [None], "runs": [run_id],
                                              "partitions": [0]})
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE run_id IS NOT NULL") == 1


def test_a_partition_joins_only_a_running_run(dsn):
    """A run that has ended (here failed, its tasks gone with retention) counts nothing more: a partition
    in a number it left free would otherwise be counted on a run that already decided."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        run_id = conn.execute("SELECT queueworker.start_run('ended', 1, NULL, NULL, NULL)").fetchone()[0]
        conn.execute("UPDATE queueworker.runs SET state = 'failed', finished_at = now() WHERE id = %s", (run_id,))
        with pytest.raises(psycopg.errors.CheckViolation, match=f"not a partition its run can count: run {run_id}"):
            conn.execute(ENQUEUE_PARTITIONS, {"queues": ["q"], "tasks": ["p"], "payloads": ["{}"], "zeros": [0],
                                              "ones": [1], "keys": [None], "runs": [run_id], "partitions": [0]})
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE run_id = %s", (run_id,)) == 0


def test_four_workers_one_killed_and_a_postgres_restart_consolidate_exactly_once(dsn, local_postgres):
    with psycopg.connect(dsn) as conn:
        run_id = start_run(conn, "big", [{"task": "qw.sleep", "queue": "parts", "payload": {"seconds": 0.02}}
                                         for _ in range(200)],
                           on_success={"task": "qw.noop", "queue": "parts"}, watermark="big")
    workers = [WorkerProcess(dsn, "--queue", "parts", "--concurrency", "8", *FAST_LEASES) for _ in range(4)]
    try:
        wait_until(lambda: run_row(dsn, run_id).succeeded >= 40, timeout=60, message="progress")
        workers[0].signal(signal.SIGKILL)
        wait_until(lambda: run_row(dsn, run_id).succeeded >= 100, timeout=60, message="more progress")
        local_postgres.restart()
        wait_until(lambda: run_row(dsn, run_id).state == "succeeded", timeout=180, message="the run to succeed")
    finally:
        for worker in workers:
            worker.stop()
    run = run_row(dsn, run_id)
    assert (run.succeeded, run.failed, run.cancelled) == (200, 0, 0)
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE run_id = %s AND run_partition IS NOT NULL "
                       "AND state = 'succeeded'", (run_id,)) == 200, "the counters equal the rows"
    consolidations = query(dsn, "SELECT id FROM queueworker.tasks WHERE run_id = %s AND run_partition IS NULL",
                           (run_id,))
    assert len(consolidations) == 1
    assert scalar(dsn, "SELECT count(*) FROM queueworker.task_events WHERE task_id = %s AND to_state = 'succeeded'",
                  (consolidations[0][0],)) == 1, "the consolidation ran to success exactly once"
    assert query(dsn, "SELECT run_id FROM queueworker.watermarks WHERE name = 'big'") == [(run_id,)]


def qw(dsn: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queueworker.cli", *args, "--dsn", dsn],
                          capture_output=True, text=True, timeout=60)


def test_cli_starts_shows_lists_retries_and_finalizes_a_run(dsn):
    started = qw(dsn, "run", "start", "nightly", "--task", "part", "--partitions", "3", "--queue", "parts",
                 "--on-success", "consolidate", "--on-failure", "alert", "--watermark", "nightly")
    assert started.returncode == 0, started.stderr
    run_id = int(started.stdout)
    assert [row[0] for row in query(dsn, "SELECT payload FROM queueworker.tasks WHERE run_id = %s "
                                         "ORDER BY run_partition", (run_id,))] == [{"partition": i} for i in range(3)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        (bad, token), *good = claim(conn, "parts").items()
        fail(conn, bad, token)
        succeed(conn, dict(good))
    shown = qw(dsn, "run", "show", str(run_id))
    assert f"run {run_id} nightly: failed, 2 succeeded, 1 failed, 0 cancelled of 3" in shown.stdout, shown.stdout
    assert "source down" in shown.stdout and "alert" in shown.stdout
    listed = json.loads(qw(dsn, "runs", "--json").stdout)
    assert [(r["id"], r["state"]) for r in listed] == [(run_id, "failed")]

    retried = qw(dsn, "run", "retry", str(run_id))
    assert f"run {run_id}: 1 partitions pending again" in retried.stdout
    assert run_row(dsn, run_id).state == "running"
    with psycopg.connect(dsn, autocommit=True) as conn:
        fail(conn, bad, claim(conn, "parts")[bad])
    assert run_row(dsn, run_id).state == "failed"
    finalized = qw(dsn, "run", "finalize", str(run_id), "--force")
    assert finalized.returncode == 0, finalized.stderr
    run = run_row(dsn, run_id)
    assert run.forced and run.success_task_id is not None, "consolidated on purpose despite the failure"
    again = qw(dsn, "run", "finalize", str(run_id), "--force")
    assert again.returncode == 2 and "only a failed run" in again.stderr
    missing = qw(dsn, "run", "show", "999999")
    assert missing.returncode == 2 and "no run with id 999999" in missing.stderr
