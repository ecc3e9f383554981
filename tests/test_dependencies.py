"""Dependencies and staged pipelines (seed 004): `blocked` until every prerequisite succeeded, promoted
in the statement that records the last success, cancelled (naming the prerequisite) when one ends
failed or cancelled, re-blocked by a retry of it. Against a real Postgres, with real worker
processes and racing producer processes."""

from __future__ import annotations

import multiprocessing
import random
import subprocess
import sys
import time
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from queueworker import TaskSpec, enqueue, enqueue_chain, enqueue_many

from queueworker.db import lease, statements, tasks
from tests.support import WorkerProcess, query, wait_until

pytestmark = pytest.mark.integration


def states(dsn: str, ids: list[int]) -> list[str]:
    found = dict(query(dsn, "SELECT id, state::text FROM queueworker.tasks WHERE id = ANY(%s)", (ids,)))
    return [found[i] for i in ids]


def claim(conn, queue: str = "default", limit: int = 100) -> dict[int, int]:
    rows = statements.fetch(conn, lease.CLAIM, lease.ClaimParams(queue=queue, worker=uuid.uuid4(), lease_seconds=30,
                                                                 timeout_seconds=60, limit=limit))
    return {row.id: row.lease_token for row in rows}


def succeed(conn, task_id: int, tokens: dict[int, int]) -> None:
    statements.fetch(conn, lease.COMPLETE_SUCCEEDED, lease.CompleteSucceededParams(
        ids=[task_id], tokens=[tokens[task_id]], results=[None]))


def fail(conn, task_id: int, tokens: dict[int, int]) -> None:
    statements.fetch(conn, lease.COMPLETE_FAILED, lease.CompleteFailedParams(
        ids=[task_id], tokens=[tokens[task_id]], retryables=[False], backoffs=[0.0],
        errors=[Jsonb({"message": "broken"})]))


def test_a_chain_runs_stage_by_stage_and_each_promotion_rides_the_success(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        a, b, c = enqueue_chain(conn, [{"task": "extract"}, {"task": "transform"}, {"task": "load"}])
        assert states(dsn, [a, b, c]) == ["pending", "blocked", "blocked"]
        tokens = claim(conn)
        assert list(tokens) == [a], "a blocked stage is never claimed"
        succeed(conn, a, tokens)
        # The statement that recorded A's success made B pending: nothing else ran in between.
        assert states(dsn, [a, b, c]) == ["succeeded", "pending", "blocked"]
        tokens = claim(conn)
        assert list(tokens) == [b]
        succeed(conn, b, tokens)
        tokens = claim(conn)
        assert list(tokens) == [c]
        succeed(conn, c, tokens)
    events = query(dsn, "SELECT task_id, from_state::text, to_state::text FROM queueworker.task_events "
                        "WHERE task_id = %s ORDER BY id", (c,))
    assert [e[1:] for e in events] == [(None, "blocked"), ("blocked", "pending"), ("pending", "running"),
                                       ("running", "succeeded")]


def test_a_failed_prerequisite_cancels_the_chain_and_its_retry_blocks_it_again(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        a, b, c = enqueue_chain(conn, [{"task": "a"}, {"task": "b"}, {"task": "c"}])
        fail(conn, a, claim(conn))
        assert states(dsn, [a, b, c]) == ["failed", "cancelled", "cancelled"]
        errors = dict(query(dsn, "SELECT id, error FROM queueworker.tasks WHERE id = ANY(%s)", ([b, c],)))
        assert errors[b]["type"] == "DependencyFailed" and errors[b]["prerequisite"] == a
        assert errors[b]["message"] == f"prerequisite task {a} ended failed"
        assert errors[c]["message"] == f"prerequisite task {b} ended cancelled (after task {a} ended)"
        assert claim(conn) == {}, "nothing of the chain is claimable"

        statements.fetch(conn, tasks.RETRY_TASK, tasks.TaskParams(id=a))
        assert states(dsn, [a, b, c]) == ["pending", "blocked", "blocked"]
        for stage in (a, b, c):
            tokens = claim(conn)
            assert list(tokens) == [stage]
            succeed(conn, stage, tokens)
    assert states(dsn, [a, b, c]) == ["succeeded"] * 3
    transitions = [row[1:] for row in query(dsn, "SELECT task_id, from_state::text, to_state::text "
                                                 "FROM queueworker.task_events WHERE task_id = %s ORDER BY id", (b,))]
    assert transitions == [(None, "blocked"), ("blocked", "cancelled"), ("cancelled", "blocked"),
                           ("blocked", "pending"), ("pending", "running"), ("running", "succeeded")]


def test_run_anyway_and_several_prerequisites(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        first, second = enqueue_many(conn, [{"task": "a"}, {"task": "b"}])
        both = enqueue(conn, "join", depends_on=[first, second])
        tolerant = enqueue(conn, "report", depends_on=[first], on_dependency_failure="run")
        tokens = claim(conn)
        succeed(conn, first, tokens)
        assert states(dsn, [both, tolerant]) == ["blocked", "pending"]
        fail(conn, second, tokens)
        assert states(dsn, [both]) == ["cancelled"]

        failed_one = enqueue(conn, "x", depends_on=[second], on_dependency_failure="run")
        doomed = enqueue(conn, "y", depends_on=[second])
        done_already = enqueue(conn, "z", depends_on=[first])
    # Settled at commit against prerequisites that had ended before.
    assert states(dsn, [failed_one, doomed, done_already]) == ["pending", "cancelled", "pending"]


def test_cancelling_a_blocked_task_cancels_what_waits_on_it(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        a, b, c = enqueue_chain(conn, [{"task": "a"}, {"task": "b"}, {"task": "c"}])
    status = subprocess.run([sys.executable, "-m", "queueworker.cli", "status", "--json", "--dsn", dsn],
                            capture_output=True, text=True, timeout=60)
    assert '"blocked": 2' in status.stdout, status.stdout
    cancelled = subprocess.run([sys.executable, "-m", "queueworker.cli", "cancel", str(b), "--dsn", dsn],
                               capture_output=True, text=True, timeout=60)
    assert cancelled.returncode == 0, cancelled.stderr
    assert states(dsn, [a, b, c]) == ["pending", "cancelled", "cancelled"]


def test_bad_prerequisites_are_refused_and_nothing_is_enqueued(dsn):
    with pytest.raises(ValidationError, match="twice"):
        TaskSpec(task="t", depends_on=[1, 1])
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        TaskSpec(task="t", depends_on=[0])
    with psycopg.connect(dsn) as conn:
        real = enqueue(conn, "a")
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="there is no task 999999 to depend on"):
            enqueue(conn, "b", depends_on=[real, 999999])
    assert query(dsn, "SELECT count(*) FROM queueworker.tasks")[0][0] == 0, "the transaction rolled back"


def test_a_blocked_task_holds_its_dedupe_key(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = enqueue(conn, "a")
        waiting = enqueue(conn, "b", dedupe_key="k", depends_on=[first])
        assert enqueue(conn, "b", dedupe_key="k") == waiting
        assert states(dsn, [waiting]) == ["blocked"]


def test_cli_enqueue_after(dsn):
    def qw(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "queueworker.cli", *args, "--dsn", dsn],
                              capture_output=True, text=True, timeout=60)
    first = qw("enqueue", "-q", "a")
    second = qw("enqueue", "-q", "b", "--after", first.stdout.strip(), "--on-dependency-failure", "run")
    assert second.returncode == 0, second.stderr
    assert states(dsn, [int(second.stdout)]) == ["blocked"]
    assert query(dsn, "SELECT cancel_on_failure FROM queueworker.task_dependencies")[0][0] is False
    unknown = qw("enqueue", "c", "--after", "424242")
    assert unknown.returncode != 0 and "there is no task 424242 to depend on" in unknown.stderr


def test_real_workers_run_a_pipeline_in_order(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        stages = enqueue_chain(conn, [{"task": "qw.sleep", "payload": {"seconds": 0.2}}] * 4)
    workers = [WorkerProcess(dsn, "--concurrency", "4") for _ in range(2)]
    try:
        wait_until(lambda: states(dsn, stages) == ["succeeded"] * 4, timeout=60, message="the pipeline to finish")
    finally:
        for worker in workers:
            worker.stop()
    spans = query(dsn, "SELECT started_at, finished_at FROM queueworker.tasks WHERE id = ANY(%s) ORDER BY id",
                  (stages,))
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])), "each stage started after the last"


def _complete_all(dsn: str, prerequisites: list[int], started) -> None:
    """Claims and completes the prerequisites one at a time, some failing."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        started.wait()
        for task_id in prerequisites:
            tokens = claim(conn, "race", limit=1)
            (fail if task_id % 7 == 0 else succeed)(conn, task_id, tokens)


def _add_dependents(dsn: str, prerequisites: list[int], seed: int, started, results) -> None:
    """Enqueues dependents of random prerequisites in short transactions while they complete."""
    rng = random.Random(seed)
    made = []
    with psycopg.connect(dsn) as conn:
        started.wait()
        for _ in range(150):
            made.append(enqueue(conn, "late", depends_on=rng.sample(prerequisites, rng.randint(1, 3))))
            if rng.random() < 0.5:
                time.sleep(0.001)
            conn.commit()
    results.put(made)


def test_dependents_enqueued_while_their_prerequisites_finish_are_never_left_blocked(dsn):
    """Producer processes add dependents while another process finishes the prerequisites: every
    dependent must end where its prerequisites put it, never stuck in `blocked`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        prerequisites = enqueue_many(conn, [{"task": "p", "queue": "race"}] * 200)
    context = multiprocessing.get_context("spawn")
    started, results = context.Barrier(4), context.Queue()
    processes = [context.Process(target=_complete_all, args=(dsn, prerequisites, started))] + [
        context.Process(target=_add_dependents, args=(dsn, prerequisites, seed, started, results))
        for seed in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    dependents = [task_id for _ in range(3) for task_id in results.get(timeout=5)]
    wrong = query(dsn, """
        SELECT t.id, t.state::text, array_agg(p.state::text)
        FROM queueworker.tasks t
        JOIN queueworker.task_dependencies d ON d.task_id = t.id
        JOIN queueworker.tasks p ON p.id = d.prerequisite_id
        WHERE t.id = ANY(%s)
        GROUP BY t.id, t.state
        HAVING t.state::text <> CASE WHEN bool_or(p.state = 'failed') THEN 'cancelled'
                                     WHEN bool_and(p.state = 'succeeded') THEN 'pending' ELSE 'blocked' END""",
                  (dependents,))
    assert wrong == [] and len(dependents) == 450
