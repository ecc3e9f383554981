"""The plans of the claims that lock no queue, plain and fair (lease.sql, `claim`, `claim_fair` and
`claim_settings`), of the claims of a queue with flow control (`claim_limited`,
`claim_limited_fair`, after `lock_queue`), and of the completion of succeeded tasks
(`complete_succeeded` after `completion_settings`): a worker plans each once per connection, and
that generic plan reads what a plan made for the statement's parameters reads, however deep the
queue or however many tasks run. The worker's sessions force custom plans for every other
statement: planning a claim for its parameters cost about as much as running it when it claims a
few tasks, and planning a completion a sixth of running it."""

from __future__ import annotations

import asyncio
import json
import uuid

import psycopg
import pytest
from psycopg import sql

from queueworker import enqueue_many
from queueworker.db import statements
from queueworker.client import operations
from queueworker.db.connection import DutyConnection
from queueworker.db.lease import (CLAIM, CLAIM_FAIR, CLAIM_LIMITED, CLAIM_LIMITED_FAIR, COMPLETE_SUCCEEDED,
                                  GENERIC_COMPLETION, LOCK_QUEUE, UNLOCKED_CLAIM_SETTINGS, ClaimedRow, ClaimParams,
                                  CompleteSucceededParams, LockQueueParams)
from queueworker.db.statements import Bound, Statement
from tests.support import numbered

pytestmark = pytest.mark.integration


def claim_params(limit: int) -> ClaimParams:
    return ClaimParams(queue="default", limit=limit, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60)


# Each claim planned once per connection, with what the worker sends before it: the claims that
# lock no queue (of a queue without keys, and of a keyed one), and those of a queue with flow
# control (a cap on its running tasks, set too high to bind), after its lock.
LOCKED = {True: Bound(LOCK_QUEUE, LockQueueParams(queue="default"))}  # always durable: one setting
CLAIMS: dict[str, tuple[Statement[ClaimParams, ClaimedRow], dict[bool, Bound]]] = {
    "plain": (CLAIM, UNLOCKED_CLAIM_SETTINGS), "fair": (CLAIM_FAIR, UNLOCKED_CLAIM_SETTINGS),
    "limited": (CLAIM_LIMITED, LOCKED), "limited fair": (CLAIM_LIMITED_FAIR, LOCKED),
}


def enqueue(dsn: str, claim: str, tasks: int) -> None:
    """`tasks` tasks in the default queue: in 100 keys for a fair claim, without keys for the others;
    with a cap on the running tasks for a limited claim."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [{"task": "t", "key": f"k{n % 100}"} if "fair" in claim else {"task": "t"}
                            for n in range(tasks)])
        if "limited" in claim:
            operations.set_limits(conn, "default", max_running=1_000_000)
        conn.execute("VACUUM ANALYZE queueworker.tasks_active")


def plans_as_run(dsn: str, statement: Statement, batches: list, first: Bound) -> tuple[int, int]:
    """Runs `statement` with each of `batches` (parameters, rows expected) as a worker runs it (a
    connection that prepares, `first` sent before it in one transaction): its generic and custom
    plans so far."""

    async def run() -> list[tuple[int, int]]:
        conn = DutyConnection(dsn, "test-planned", prepare=True)

        async def plans(session: psycopg.AsyncConnection) -> list[tuple[int, int]]:
            cursor = await session.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                                           " WHERE statement = %s", (numbered(statement.text)[0],))  # as sent
            return await cursor.fetchall()
        try:
            for params, expected in batches:
                assert len(await conn.fetch(statement, params, first=first)) == expected
            return await conn.using(plans)
        finally:
            await conn.close()

    [(generic, custom)] = asyncio.run(run())
    return generic, custom


@pytest.mark.parametrize(("claim", "async_commit"), [(claim, asynchronous) for claim, (_, firsts) in CLAIMS.items()
                                                     for asynchronous in firsts])
def test_a_worker_plans_its_claim_once_per_connection(dsn, claim, async_commit):
    """As a worker claims (its duty connection, what it sends first: the claim's settings, or the
    queue's lock): the prepared claim has generic plans only, with asynchronous commits or without
    (--no-async-claim-commit; a claim under the lock always commits durably)."""
    enqueue(dsn, claim, 50)
    statement, firsts = CLAIMS[claim]
    generic, custom = plans_as_run(dsn, statement, [(claim_params(10), 10)] * 4, firsts[async_commit])
    assert custom == 0
    assert generic >= 1


def explained(conn: psycopg.Connection, statement: Statement, first: Bound, plan_mode: str, params) -> dict:
    """EXPLAIN (ANALYZE, BUFFERS) of `statement`, prepared as "measured", run as the worker runs it
    (`first` before it) under `plan_mode`, in a transaction rolled back so that each measure
    changes the same rows."""
    with conn.transaction(force_rollback=True):
        statements.execute(conn, first.statement, first.params)
        conn.execute(sql.SQL("SET LOCAL plan_cache_mode = {}").format(sql.Literal(plan_mode)))
        values = statement.bind(params)
        [[plan]] = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE measured ({})").format(
            sql.SQL(", ").join(sql.Literal(values[name]) for name in numbered(statement.text)[1]))).fetchall()
    return (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]


def nodes(node: dict) -> list[dict]:
    return [node, *(found for child in node.get("Plans", ()) for found in nodes(child))]


@pytest.mark.parametrize("claim", CLAIMS)
def test_the_generic_plan_reads_what_a_custom_plan_reads_at_a_backlog_of_twenty_thousand(dsn, claim):
    """20,000 tasks waiting, a claim of 10. A generic plan cannot know the LIMIT: had the claim
    joined the rows it picked to the table, the planner would size that join at a tenth of the
    table and hash the whole partition (a sequential scan of 20,000 rows for 10). It takes its rows
    by primary key instead, so the generic plan reads about what the plan made for LIMIT 10 reads."""
    enqueue(dsn, claim, 20_000)
    statement, firsts = CLAIMS[claim]
    with psycopg.connect(dsn, prepare_threshold=None) as conn:
        conn.pgconn.prepare(b"measured", numbered(statement.text)[0].encode())
        params = claim_params(10)
        buffers = {}
        for mode in ("force_custom_plan", "force_generic_plan"):
            explained(conn, statement, firsts[True], mode, params)  # warm
            plan = explained(conn, statement, firsts[True], mode, params)
            # the partition read or hashed whole (a node that never ran, under a LIMIT of 0, reads nothing)
            whole = [(node["Node Type"], node.get("Relation Name")) for node in nodes(plan)
                     if node["Node Type"] in ("Seq Scan", "Hash Join") and node.get("Relation Name") != "queues"
                     and node["Actual Loops"] > 0]
            assert not whole, (mode, whole)
            buffers[mode] = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
            assert plan["Actual Rows"] == 10
    print(f"buffers of a {claim} claim of 10 at 20,000 waiting: {buffers}")
    assert buffers["force_generic_plan"] <= 1.5 * buffers["force_custom_plan"]


def claimed(dsn: str, tasks: int) -> list[ClaimedRow]:
    """`tasks` plain tasks enqueued and claimed: running, each with its lease."""
    enqueue(dsn, "plain", tasks)
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = statements.fetch(conn, CLAIM, claim_params(tasks))
        conn.execute("VACUUM ANALYZE queueworker.tasks_active")
    assert len(rows) == tasks
    return rows


def completion(rows: list[ClaimedRow]) -> CompleteSucceededParams:
    return CompleteSucceededParams(ids=[row.id for row in rows], tokens=[row.lease_token for row in rows],
                                   results=["{}"] * len(rows))


def test_a_worker_plans_its_completions_once_per_connection(dsn):
    """As the completer writes successes (its outcome connection, the completion's settings sent
    first): the prepared completion has generic plans only."""
    rows = claimed(dsn, 40)

    generic, custom = plans_as_run(dsn, COMPLETE_SUCCEEDED, [(completion(rows[first:first + 5]), 5)
                                                            for first in range(0, 40, 5)], GENERIC_COMPLETION)
    assert custom == 0
    assert generic >= 1


def test_the_generic_completion_reads_what_a_custom_one_reads_with_twenty_thousand_running(dsn):
    """20,000 tasks running, a completion of 10: the generic plan, which cannot know how many ids
    it is given, reads about what the plan made for those 10 reads, and neither reads the running
    tasks whole."""
    rows = claimed(dsn, 20_000)
    with psycopg.connect(dsn, prepare_threshold=None) as conn:
        conn.pgconn.prepare(b"measured", numbered(COMPLETE_SUCCEEDED.text)[0].encode())
        buffers = {}
        for mode in ("force_custom_plan", "force_generic_plan"):
            explained(conn, COMPLETE_SUCCEEDED, GENERIC_COMPLETION, mode, completion(rows[:10]))  # warm
            plan = explained(conn, COMPLETE_SUCCEEDED, GENERIC_COMPLETION, mode, completion(rows[:10]))
            read = [node for node in nodes(plan) if node.get("Relation Name") == "tasks_active"]
            assert read and all(node["Actual Rows"] <= 10 for node in read), (mode, read)
            buffers[mode] = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
            assert plan["Actual Rows"] == 10
    print(f"buffers of a completion of 10 with 20,000 running: {buffers}")
    assert buffers["force_generic_plan"] <= 1.5 * buffers["force_custom_plan"]
