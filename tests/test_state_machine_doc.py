"""docs/state-machine.md must stay true to the code: every documented task transition is one the
SQL really makes (and no other), and every documented worker-state transition is one a running
worker really makes (and no other)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from queueworker import cancel, metrics

from queueworker.db import duties, lease, runs, statements, tasks
from queueworker.db.migrate import migrate
from queueworker.client.producer import enqueue, enqueue_chain, enqueue_many, start_run
from queueworker.settings import WorkerSettings
from queueworker.runtime.worker import State, Worker
from tests.support import builtin_registry, query, until

DOC = Path(__file__).resolve().parent.parent / "docs" / "state-machine.md"




def _first_table(heading: str) -> list[list[str]]:
    section = DOC.read_text().split(heading, 1)[1]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        if not set(line) <= set("|- :"):
            table.append([cell.strip() for cell in line.strip("|").split("|")])
    return table[1:]


def documented_task_transitions() -> set[tuple[str, str]]:
    return {("" if row[0] == "(none)" else row[0], row[1]) for row in _first_table("## Task states")}


def documented_worker_transitions() -> set[tuple[str, str]]:
    return {(row[0], row[1]) for row in _first_table("## Worker process states")}


def test_worker_state_table_names_the_state_enum():
    documented = {cell for pair in documented_worker_transitions() for cell in pair}
    assert documented == {state.value for state in State}


def _transitions_seen() -> Counter:
    return Counter({(sample.labels["from_state"], sample.labels["to_state"]): sample.value
                    for metric in metrics.WORKER_STATE_TRANSITIONS.collect() for sample in metric.samples
                    if sample.name.endswith("_total")})


SETTINGS = WorkerSettings(concurrency=2, lease_seconds=3, drain_seconds=1, poll_min_seconds=0.05)


async def _run(worker: Worker, reached) -> int:
    """Runs the worker until it stops by itself or `reached()` holds, then stops it; its exit code."""
    running = asyncio.create_task(worker.run())

    async def stopped_or_reached() -> bool:
        return running.done() or await reached()
    try:
        await until(stopped_or_reached, 30, "the worker to stop or reach the step's state", interval=0.05)
    finally:
        if not running.done():
            worker.request_stop()
    return await running


def _in_state(worker: Worker, state: State):
    async def check() -> bool:
        return worker.state is state
    return check


@pytest.mark.integration
def test_documented_worker_transitions_are_exactly_the_ones_a_worker_makes(dsn):
    """Drives real workers (real Postgres) through every path of the fetch loop's state machine,
    and compares the transitions their metric counted with the documented table."""
    before = _transitions_seen()

    # Work comes and goes: full and partial batches, no free slots, idle, a stop while idle.
    with psycopg.connect(dsn) as conn:
        ids = enqueue_many(conn, [{"task": "qw.sleep", "payload": {"seconds": 0.2}}] * 5)

    async def all_done() -> bool:
        return await asyncio.to_thread(lambda: query(dsn, "SELECT count(*) FROM queueworker.tasks WHERE "
                                                          "id = ANY(%s) AND state = 'succeeded'", (ids,))[0][0] == 5)
    worker = Worker(dsn, SETTINGS, builtin_registry())

    async def done_and_idle() -> bool:
        return await all_done() and worker.state is State.IDLE
    assert asyncio.run(_run(worker, done_and_idle)) == 0

    # No schema yet: start-up errors, then a stop before the worker ever started.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA queueworker CASCADE")
    starting = Worker(dsn, SETTINGS, builtin_registry())
    assert asyncio.run(_run(starting, _in_state(starting, State.ERROR_WAIT))) == 0
    migrate(dsn)

    # Claims fail, the worker waits, tries again, and is stopped while it waits.
    failing = Worker(dsn, SETTINGS, builtin_registry())
    calls = []

    def broken_claim(queue: str) -> None:  # raised where the claim was about to be sent
        calls.append(queue)
        raise RuntimeError("injected claim failure")
    failing.signals.claiming.watch(broken_claim)

    async def failed_twice() -> bool:
        return len(calls) >= 2 and failing.state is State.ERROR_WAIT
    assert asyncio.run(_run(failing, failed_twice)) == 0

    # A stop request arrives while a full batch is being claimed.
    with psycopg.connect(dsn) as conn:
        enqueue_many(conn, [{"task": "qw.sleep", "payload": {"seconds": 5}}] * 2)
    claiming = Worker(dsn, SETTINGS, builtin_registry())
    claiming.signals.claimed.watch(lambda rows: claiming.request_stop())  # as the claim returns
    assert asyncio.run(_run(claiming, lambda: asyncio.sleep(0, False))) == 0

    # A stop request arrives during the start-up rescue pass.
    recovering = Worker(dsn, SETTINGS, builtin_registry())
    real_rescue = recovering.rescuer.rescue_once

    async def rescue_then_stop() -> tuple[int, int]:
        recovering.request_stop()
        return await real_rescue()
    recovering.rescuer.rescue_once = rescue_then_stop
    assert asyncio.run(_run(recovering, lambda: asyncio.sleep(0, False))) == 0

    seen = {pair for pair, count in (_transitions_seen() - before).items() if count}
    assert seen == documented_worker_transitions()


@pytest.mark.integration
def test_documented_task_transitions_are_exactly_the_ones_the_sql_makes(dsn):
    worker = uuid.uuid4()
    claim = lease.ClaimParams(queue="default", worker=worker, lease_seconds=30, timeout_seconds=60, limit=100)
    rescue = duties.RescueParams(deadline_grace=0, worker_ttl=60, limit=100)

    def claimed_token(conn, task_id):
        rows = statements.fetch(conn, lease.CLAIM, claim)
        return next(r.lease_token for r in rows if r.id == task_id)

    def fail(conn, task_id, token, retryable):
        statements.fetch(conn, lease.COMPLETE_FAILED, lease.CompleteFailedParams(
            ids=[task_id], tokens=[token], retryables=[retryable], backoffs=[0.0], errors=[Jsonb({"message": "x"})]))

    def retry(conn, task_id):
        statements.fetch(conn, tasks.RETRY_TASK, tasks.TaskParams(id=task_id))

    def succeed(conn, task_id):
        statements.fetch(conn, lease.COMPLETE_SUCCEEDED, lease.CompleteSucceededParams(
            ids=[task_id], tokens=[claimed_token(conn, task_id)], results=[None]))

    def expire(conn, task_id):
        conn.execute("UPDATE queueworker.tasks SET leased_until = now() - interval '1s' WHERE id = %s", (task_id,))

    with psycopg.connect(dsn, autocommit=True) as conn:
        ok = enqueue(conn, "qw.noop")
        succeed(conn, ok)

        retried = enqueue(conn, "qw.noop", max_attempts=2)
        fail(conn, retried, claimed_token(conn, retried), retryable=True)               # running -> retrying
        statements.fetch(conn, duties.PROMOTE_DUE, duties.PromoteDueParams(
            limit=10))                              # retrying -> pending
        fail(conn, retried, claimed_token(conn, retried), retryable=True)               # attempts spent -> failed
        retry(conn, retried)                                                            # failed -> pending

        first, second = enqueue_chain(conn, [{"task": "qw.noop"}, {"task": "qw.noop"}])  # (none) -> blocked
        fail(conn, first, claimed_token(conn, first), retryable=False)                 # blocked -> cancelled
        retry(conn, first)                                                              # cancelled -> blocked
        succeed(conn, first)                                                            # blocked -> pending
        cancel(conn, enqueue(conn, "qw.noop", depends_on=[second]))  # blocked -> cancelled

        enqueue(conn, "qw.noop", {"v": 1}, dedupe_key="doc")
        enqueue(conn, "qw.noop", {"v": 2}, dedupe_key="doc", on_conflict="replace")    # pending -> pending

        released = enqueue(conn, "qw.noop")
        claimed_token(conn, released)
        statements.fetch(conn, lease.RELEASE, lease.DeregisterWorkerParams(worker=worker))  # running -> pending

        unknown = enqueue(conn, "no.such.task")                                          # running -> pending
        statements.fetch(conn, lease.HAND_BACK, lease.HandBackParams(
            ids=[unknown], tokens=[claimed_token(conn, unknown)], delays=[10.0], errors=[Jsonb({"message": "x"})],
            graces=[600.0]))
        snoozed = enqueue(conn, "qw.noop")                                               # running -> pending
        statements.fetch(conn, lease.HAND_BACK, lease.HandBackParams(
            ids=[snoozed], tokens=[claimed_token(conn, snoozed)], delays=[5.0],
            errors=[Jsonb({"type": "Snoozed", "message": "x"})], graces=[None]))
        paged = enqueue(conn, "qw.noop")                                    # running -> succeeded, (none) -> pending
        statements.fetch(conn, lease.COMPLETE_CONTINUED, lease.CompleteContinuedParams(
            ids=[paged], tokens=[claimed_token(conn, paged)], results=[None], next_payloads=[Jsonb({"page": 2})],
            next_delays=[0.0], next_headers=[None]))

        rescued = enqueue(conn, "qw.noop", max_attempts=2)
        claimed_token(conn, rescued)
        expire(conn, rescued)
        statements.fetch(conn, duties.RESCUE, rescue)                                   # running -> pending
        claimed_token(conn, rescued)
        expire(conn, rescued)
        statements.fetch(conn, duties.RESCUE, rescue)                                   # running -> failed

        for doomed_state in ("pending", "retrying", "running"):
            doomed = enqueue(conn, "qw.noop")
            if doomed_state != "pending":
                token = claimed_token(conn, doomed)
                if doomed_state == "retrying":
                    statements.fetch(conn, lease.COMPLETE_FAILED, lease.CompleteFailedParams(
                        ids=[doomed], tokens=[token], retryables=[True], backoffs=[3600.0],
                        errors=[Jsonb({"message": "x"})]))
            cancel(conn, doomed)
        retry(conn, doomed)                                                             # cancelled -> pending

    seen = {(from_state or "", to_state) for from_state, to_state in query(
        dsn, "SELECT DISTINCT from_state::text, to_state::text FROM queueworker.task_events")}
    assert seen == documented_task_transitions()


def documented_run_transitions() -> set[tuple[str, str]]:
    return {("" if row[0] == "(none)" else row[0], row[1]) for row in _first_table("## Run states")}


@pytest.mark.integration
def test_documented_run_transitions_are_exactly_the_ones_the_run_events_record(dsn):
    claim = lease.ClaimParams(queue="default", worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60, limit=100)

    def claim_all(conn) -> dict[int, int]:
        return {row.id: row.lease_token for row in statements.fetch(conn, lease.CLAIM, claim)}

    def succeed(conn, tokens: dict[int, int]) -> None:
        statements.fetch(conn, lease.COMPLETE_SUCCEEDED, lease.CompleteSucceededParams(
            ids=list(tokens), tokens=list(tokens.values()), results=[None] * len(tokens)))

    def fail(conn, tokens: dict[int, int]) -> None:
        statements.fetch(conn, lease.COMPLETE_FAILED, lease.CompleteFailedParams(
            ids=list(tokens), tokens=list(tokens.values()), retryables=[False] * len(tokens),
            backoffs=[0.0] * len(tokens), errors=[Jsonb({"message": "x"})] * len(tokens)))

    def retry(conn, task_id: int) -> None:
        statements.fetch(conn, tasks.RETRY_TASK, tasks.TaskParams(id=task_id))

    def named(conn, tokens: dict[int, int], task: str) -> dict[int, int]:
        names = dict(conn.execute("SELECT id, task FROM queueworker.tasks WHERE id = ANY(%s)", (list(tokens),)))
        return {task_id: token for task_id, token in tokens.items() if names[task_id] == task}

    def events(run_id: int) -> list[tuple[str | None, str]]:
        return query(dsn, "SELECT from_state::text, to_state::text FROM queueworker.run_events "
                          "WHERE run_id = %s ORDER BY id", (run_id,))

    consolidate, alert = {"task": "consolidate"}, {"task": "alert"}
    with psycopg.connect(dsn, autocommit=True) as conn:
        happy = start_run(conn, "happy", [{"task": "p"}] * 2, on_success=consolidate, on_failure=alert)
        succeed(conn, claim_all(conn))  # the partitions; then the consolidation
        succeed(conn, claim_all(conn))

        plain = start_run(conn, "plain", [{"task": "p"}])
        succeed(conn, claim_all(conn))

        troubled = start_run(conn, "troubled", [{"task": "p"}], on_success=consolidate, on_failure=alert)
        partition, = claim_all(conn).items()
        fail(conn, dict([partition]))
        retry(conn, partition[0])
        partition, = (item for item in claim_all(conn).items() if item[0] == partition[0])
        fail(conn, dict([partition]))
        statements.fetch(conn, runs.FINALIZE_RUN, runs.RunParams(id=troubled))
        consolidation = named(conn, claim_all(conn), "consolidate")
        fail(conn, consolidation)
        retry(conn, next(iter(consolidation)))
        succeed(conn, named(conn, claim_all(conn), "consolidate"))

    assert events(happy) == [(None, "running"), ("running", "running"), ("running", "succeeded")]
    assert events(plain) == [(None, "running"), ("running", "succeeded")]
    assert events(troubled) == [(None, "running"), ("running", "failed"), ("failed", "running"),
                                ("running", "failed"), ("failed", "running"), ("running", "running"),
                                ("running", "failed"), ("failed", "running"), ("running", "succeeded")]
    seen = {(from_state or "", to_state) for from_state, to_state in query(
        dsn, "SELECT DISTINCT from_state::text, to_state::text FROM queueworker.run_events")}
    assert seen == documented_run_transitions()
