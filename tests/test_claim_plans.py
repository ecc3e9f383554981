"""The plans of the claims that lock no queue, plain and fair (lease.sql, `claim`, `claim_fair`:
the functions queueworker.claim_tasks and queueworker.claim_fair_tasks, migrations/functions/35_claims.sql),
of the claims of a queue with flow control (`claim_limited`, `claim_limited_fair`, after
`lock_queue`), and of the completion of succeeded tasks (`complete_succeeded` after
`completion_settings`): a worker plans each once per connection, and that generic plan reads what
a plan made for the statement's parameters reads, however deep the queue or however many tasks run.
The worker's sessions force custom plans for every other statement: planning a claim for its
parameters cost about as much as running it when it claims a few tasks, and planning a completion
a sixth of running it. A claim function's statement is planned by PL/pgSQL, once per session
(tests/test_nested_plans.py counts it): here its body is prepared as a statement of its own, with
the settings of the function's SET clauses, and explained as the function runs it."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import NamedTuple

import psycopg
import pytest
from psycopg import sql

from queueworker import enqueue_many
from queueworker.db import statements
from queueworker.client import operations
from queueworker.db.connection import DutyConnection
from queueworker.db.lease import (ASYNC_COMMIT_CLAIMS, CLAIM, CLAIM_FAIR, CLAIM_LIMITED, CLAIM_LIMITED_FAIR,
                                  COMPLETE_SUCCEEDED, GENERIC_COMPLETION, LOCK_QUEUE, ClaimedRow, ClaimParams,
                                  CompleteSucceededParams, LockQueueParams, claim_function_statement)
from queueworker.db.statements import Bound, Statement
from tests.support import numbered

pytestmark = pytest.mark.integration


def claim_params(limit: int) -> ClaimParams:
    return ClaimParams(queue="default", limit=limit, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60)


# Each claim as a worker sends it, with or without --async-claim-commit: the statement, and what goes
# before it in its transaction. The claims that lock no queue (of a queue without keys, and of a keyed
# one) are one statement each; those of a queue with flow control (a cap on its running tasks, set
# too high to bind) follow the queue's lock, and always commit durably.
LOCKED = Bound(LOCK_QUEUE, LockQueueParams(queue="default"))
AsSent = tuple[Statement[ClaimParams, ClaimedRow], Bound | None]
CLAIMS: dict[str, dict[bool, AsSent]] = {
    "plain": {False: (CLAIM, None), True: (ASYNC_COMMIT_CLAIMS[CLAIM], None)},
    "fair": {False: (CLAIM_FAIR, None), True: (ASYNC_COMMIT_CLAIMS[CLAIM_FAIR], None)},
    "limited": {True: (CLAIM_LIMITED, LOCKED)}, "limited fair": {True: (CLAIM_LIMITED_FAIR, LOCKED)},
}
# The claims that call a function (migrations/functions/35_claims.sql), and its name.
FUNCTIONS = {CLAIM: "claim_tasks", ASYNC_COMMIT_CLAIMS[CLAIM]: "claim_tasks",
             CLAIM_FAIR: "claim_fair_tasks", ASYNC_COMMIT_CLAIMS[CLAIM_FAIR]: "claim_fair_tasks"}


class Measured(NamedTuple):
    """A statement as the server runs it, prepared as "measured": its parameters' names in the order of
    its placeholders, and what its transaction runs before it (a statement; the settings of a
    function's SET clauses)."""

    names: list[str]
    first: Bound | None
    settings: list[tuple[str, str]]


def prepared(conn: psycopg.Connection, statement: Statement, first: Bound | None) -> Measured:
    """Prepares `statement` as "measured", as the server runs it: the statement of the function a
    claim calls, or the statement itself."""
    function = FUNCTIONS.get(statement)
    if function is None:
        text, names = numbered(statement.text)
        settings: list[tuple[str, str]] = []
    else:
        text, names = numbered(claim_function_statement(statement))
        with conn.transaction():  # ended here: a transaction left open would hold now() for the measures
            config, = conn.execute("SELECT proconfig FROM pg_proc WHERE oid = %s::regproc",
                                   (f"queueworker.{function}",)).fetchone()
        settings = [tuple(setting.split("=", 1)) for setting in config]
        assert dict(settings) == {"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off"}, settings
    conn.pgconn.prepare(b"measured", text.encode())
    return Measured(names, first, settings)


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


@pytest.mark.parametrize("claim", [claim for claim, runs in CLAIMS.items() if runs[True][1] is not None])
def test_a_worker_plans_its_locked_claim_once_per_connection(dsn, claim):
    """As a worker claims a queue with flow control (its duty connection, the queue's lock sent first):
    the prepared claim has generic plans only (a claim under the lock always commits durably). The
    claims that lock no queue are functions, whose plans PL/pgSQL keeps (tests/test_nested_plans.py)."""
    enqueue(dsn, claim, 50)
    statement, first = CLAIMS[claim][True]
    generic, custom = plans_as_run(dsn, statement, [(claim_params(10), 10)] * 4, first)
    assert custom == 0
    assert generic >= 1


def explained(conn: psycopg.Connection, measured: Measured, plan_mode: str, params) -> dict:
    """EXPLAIN (ANALYZE, BUFFERS) of the statement prepared as "measured", run as the worker's
    transaction runs it (what goes first, the function's settings) under `plan_mode`, in a
    transaction rolled back so that each measure changes the same rows."""
    with conn.transaction(force_rollback=True):
        if measured.first is not None:
            statements.execute(conn, measured.first.statement, measured.first.params)
        for name, value in measured.settings:
            conn.execute("SELECT set_config(%s, %s, true)", (name, value))
        conn.execute(sql.SQL("SET LOCAL plan_cache_mode = {}").format(sql.Literal(plan_mode)))
        values = vars(params)
        [[plan]] = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE measured ({})").format(
            sql.SQL(", ").join(sql.Literal(values[name]) for name in measured.names))).fetchall()
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
    statement, first = CLAIMS[claim][True]
    with psycopg.connect(dsn, prepare_threshold=None) as conn:
        measured = prepared(conn, statement, first)
        params = claim_params(10)
        buffers = {}
        for mode in ("force_custom_plan", "force_generic_plan"):
            explained(conn, measured, mode, params)  # warm
            plan = explained(conn, measured, mode, params)
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
        measured = prepared(conn, COMPLETE_SUCCEEDED, GENERIC_COMPLETION)
        buffers = {}
        for mode in ("force_custom_plan", "force_generic_plan"):
            explained(conn, measured, mode, completion(rows[:10]))  # warm
            plan = explained(conn, measured, mode, completion(rows[:10]))
            read = [node for node in nodes(plan) if node.get("Relation Name") == "tasks_active"]
            assert read and all(node["Actual Rows"] <= 10 for node in read), (mode, read)
            buffers[mode] = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
            assert plan["Actual Rows"] == 10
    print(f"buffers of a completion of 10 with 20,000 running: {buffers}")
    assert buffers["force_generic_plan"] <= 1.5 * buffers["force_custom_plan"]
