"""Every enqueue path, and every claim as a worker runs it, plans its nested statements once per
session, not at every call; a completion runs none per task.

The triggers and row-level security of an insert run statements of their own (the audit row, the
queue-grant checks), and a key-limited queue's claim runs those of its lock. A SQL-language function
that Postgres cannot inline (one with a SET clause, or SECURITY DEFINER) is planned again at each
call on Postgres 15, while PL/pgSQL keeps its plans for the session (generic ones, where it asks for
them: a worker's session forces custom plans). Measured by pg_stat_statements,
which counts each nested statement's plans, on a server of this test's own that loads it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.types.json import Jsonb

from queueworker.client import operations
from queueworker.client.producer import enqueue_many
from queueworker.db.connection import DutyConnection
from queueworker.db import statements
from queueworker.db.lease import (ASYNC_COMMIT_CLAIMS, CLAIM, CLAIM_FAIR, CLAIM_KEYS, COMPLETE_SUCCEEDED, LOCK_KEYS,
                                  ClaimParams, CompleteSucceededParams, KeyClaimParams, LockQueueParams)
from queueworker.db.statements import Bound
from queueworker.dev.localpg import LocalPostgres, PostgresNotFound
from queueworker.migrate import migrate

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parent.parent / "docs" / "database-roles.sql"
WARM_UP = 3  # calls before counting: the session's first plans
COUNTED = 20


@pytest.fixture(scope="module")
def server() -> Iterator[dict[str, str]]:
    """A migrated server that tracks nested statements' plans; URLs of its superuser (`admin`, free
    of queue grants) and of a producer login of docs/database-roles.sql granted the queue `jobs`."""
    try:
        local = LocalPostgres(extra_settings={"shared_preload_libraries": "pg_stat_statements",
                                              "pg_stat_statements.track": "all",
                                              "pg_stat_statements.track_planning": "on"})
    except PostgresNotFound as exc:
        pytest.fail(str(exc)) if os.environ.get("CI") else pytest.skip(str(exc))
    local.start()
    try:
        migrate(local.dsn)
        password = secrets.token_urlsafe(18)
        with psycopg.connect(local.dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            conn.execute(SCRIPT.read_text())
            conn.execute(pgsql.SQL("CREATE ROLE plans_producer LOGIN PASSWORD {} IN ROLE queueworker_producer").format(
                pgsql.Literal(password)))
            conn.execute("SELECT queueworker.grant_queue('queueworker_producer', 'jobs')")
        yield {"admin": local.dsn,
               "producer": psycopg.conninfo.make_conninfo(local.dsn, user="plans_producer", password=password)}
    finally:
        local.destroy()


ENQUEUES: dict[str, Callable[[psycopg.Connection, int], object]] = {
    "python": lambda conn, n: enqueue_many(conn, [{"task": "t", "queue": "jobs", "payload": {"n": n}}]),
    "python, keyed": lambda conn, n: enqueue_many(conn, [{"task": "t", "queue": "jobs", "key": f"k{n % 3}"}]),
    "sql enqueue": lambda conn, n: conn.execute("SELECT queueworker.enqueue('t', %s, 'jobs')", (Jsonb({"n": n}),)),
    "sql enqueue_many": lambda conn, n: conn.execute(
        "SELECT queueworker.enqueue_many(%s)", (Jsonb([{"task": "t", "queue": "jobs", "payload": {"n": n}}]),)),
}


def nested_statements(admin: str, warm_up: Callable[[], object], counted: Callable[[], object]) -> list[tuple]:
    """The nested statements (pg_stat_statements) that ran during `counted`, after `warm_up`: their
    calls, plans, mean planning time (ms) and the start of their text."""
    warm_up()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
    counted()
    with psycopg.connect(admin, autocommit=True) as conn:
        nested = conn.execute("SELECT calls, plans, query, round(mean_plan_time::numeric, 3) FROM pg_stat_statements"
                              " WHERE NOT toplevel").fetchall()
    assert nested, "no nested statement ran: pg_stat_statements does not see them"
    return [(calls, plans, t, " ".join(query.split())[:100]) for calls, plans, query, t in nested]


def nested_plans_per_call(admin: str, warm_up: Callable[[], object], counted: Callable[[], object]) -> list[tuple]:
    """The nested statements planned at each of COUNTED calls of `counted`, after `warm_up`."""
    return [statement for statement in nested_statements(admin, warm_up, counted) if statement[1] >= COUNTED]


@pytest.mark.parametrize("login", ["admin", "producer"])
@pytest.mark.parametrize("path", list(ENQUEUES))
def test_an_enqueue_plans_no_nested_statement_at_every_call(server: dict[str, str], login: str, path: str):
    enqueue = ENQUEUES[path]
    # Generic plans only: a statement of PL/pgSQL with parameters is otherwise planned again at each
    # call while the plan cache judges a custom plan cheaper, by design; what is left is planned again
    # whatever the plan cache's mode.
    with psycopg.connect(server[login], autocommit=True, options="-c plan_cache_mode=force_generic_plan") as conn:
        replanned = nested_plans_per_call(server["admin"], lambda: [enqueue(conn, n) for n in range(WARM_UP)],
                                          lambda: [enqueue(conn, n) for n in range(COUNTED)])
    assert not replanned, "planned at every call:\n" + "\n".join(map(str, replanned))


# Each claim as a worker sends it by default: the queue it claims from (its settings, its tasks' keys),
# the statement, and what goes before it in its transaction.
CLAIMS = {
    "plain": (ASYNC_COMMIT_CLAIMS[CLAIM], None),
    "fair": (ASYNC_COMMIT_CLAIMS[CLAIM_FAIR], None),
    "key-limited": (CLAIM_KEYS, Bound(LOCK_KEYS, LockQueueParams(queue="key-limited"))),
}


@pytest.mark.parametrize("claim", CLAIMS)
def test_a_claim_plans_no_nested_statement_at_every_call(server: dict[str, str], claim: str):
    """As a worker runs it, on a worker's own connection, whose session forces custom plans: the
    claims that lock no queue are PL/pgSQL functions (queueworker.claim_tasks, claim_fair_tasks), and
    the statements of a key-limited queue's lock (queueworker.lock_key_limited_queue) run under the
    lock that serialises the queue's claims; each would be planned at every claim unless it asks for
    a generic plan."""
    statement, first = CLAIMS[claim]
    with psycopg.connect(server["admin"], autocommit=True) as conn:
        if claim == "key-limited":
            operations.set_limits(conn, claim, per_key_max_running=1_000)
        enqueue_many(conn, [{"task": "t", "queue": claim, **({"key": f"k{n % 3}"} if claim != "plain" else {})}
                            for n in range(WARM_UP + COUNTED)])
    params = ClaimParams(queue=claim, limit=1, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60)
    if statement is CLAIM_KEYS:
        params = KeyClaimParams(**vars(params), held_keys=[])

    def claims(count: int) -> None:
        async def run() -> None:
            conn = DutyConnection(server["admin"], "test-nested-plans", prepare=True)
            try:
                for _ in range(count):
                    assert len(await conn.fetch(statement, params, first=first)) == 1
            finally:
                await conn.close()
        asyncio.run(run())
    replanned = nested_plans_per_call(server["admin"], lambda: claims(WARM_UP), lambda: claims(COUNTED))
    assert not replanned, "planned at every call:\n" + "\n".join(map(str, replanned))


def test_a_completion_runs_no_statement_of_its_own_for_each_task(server: dict[str, str]):
    """`complete_succeeded` writes each task's audit row through queueworker.transition_detail, a
    SQL-language function Postgres inlines into the completion's own plan. Declared IMMUTABLE over a
    body that is only STABLE (jsonb_build_object), it was not inlined, and ran as a statement of its
    own for every task completed."""
    claimed: list = []

    def claim() -> None:
        claimed.extend(statements.fetch(conn, CLAIM, ClaimParams(queue="completed", limit=COUNTED, worker=uuid.uuid4(),
                                                                 lease_seconds=30, timeout_seconds=60)))
        assert len(claimed) == COUNTED

    def complete() -> None:
        done = statements.fetch(conn, COMPLETE_SUCCEEDED, CompleteSucceededParams(
            ids=[row.id for row in claimed], tokens=[row.lease_token for row in claimed], results=[None] * COUNTED))
        assert len(done) == COUNTED

    with psycopg.connect(server["admin"], autocommit=True) as conn:
        enqueue_many(conn, [{"task": "t", "queue": "completed"}] * COUNTED)
        per_task = [statement for statement in nested_statements(server["admin"], claim, complete)
                    if statement[0] >= COUNTED]
    assert not per_task, "run once per task:\n" + "\n".join(map(str, per_task))
