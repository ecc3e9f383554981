"""Every enqueue path plans its nested statements once per session, not at every call.

The triggers and row-level security of an insert run statements of their own (the audit row, the
queue-grant checks). A SQL-language function that Postgres cannot inline (one with a SET clause, or
SECURITY DEFINER) is planned again at each call on Postgres 15, while PL/pgSQL keeps its plans for
the session. Measured by pg_stat_statements, which counts each nested statement's plans, on a server
of this test's own that loads it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.types.json import Jsonb

from queueworker.client.producer import enqueue_many
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


@pytest.mark.parametrize("login", ["admin", "producer"])
@pytest.mark.parametrize("path", list(ENQUEUES))
def test_an_enqueue_plans_no_nested_statement_at_every_call(server: dict[str, str], login: str, path: str):
    enqueue = ENQUEUES[path]
    # Generic plans only: a statement of PL/pgSQL with parameters is otherwise planned again at each
    # call while the plan cache judges a custom plan cheaper, by design; what is left is planned again
    # whatever the plan cache's mode.
    with psycopg.connect(server[login], autocommit=True, options="-c plan_cache_mode=force_generic_plan") as conn:
        for n in range(WARM_UP):
            enqueue(conn, n)
        with psycopg.connect(server["admin"], autocommit=True) as admin:
            admin.execute("SELECT pg_stat_statements_reset()")
        for n in range(COUNTED):
            enqueue(conn, n)
    with psycopg.connect(server["admin"], autocommit=True) as admin:
        nested = admin.execute("SELECT calls, plans, query, round(mean_plan_time::numeric, 3) FROM pg_stat_statements WHERE NOT toplevel").fetchall()
    assert nested, "the enqueue ran no nested statement: pg_stat_statements does not see them"
    replanned = [(calls, plans, t, " ".join(query.split())[:100]) for calls, plans, query, t in nested if plans >= COUNTED]
    assert not replanned, "planned at every call:\n" + "\n".join(map(str, replanned))
