"""The pytest plugin of queueworker (entry point `pytest11`, so active wherever queueworker is
installed; `-p no:queueworker` turns it off): each test that asks for `queueworker_db` gets a
connection to a database of its own, migrated, and dropped after the test.

The server is the one `QUEUEWORKER_TEST_DSN` names (a role that may create databases), else a
throwaway local Postgres, started on first use like `queueworker demo`'s (its binaries from the
system, else the `pgserver` wheel) and removed at the end of the session. Each pytest process
migrates one template database once and copies it for every test (CREATE DATABASE ... TEMPLATE),
which costs a fraction of migrating. Nothing here is imported before a test asks for it, so the
plugin costs a test suite that does not use it nothing.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

TEST_DSN_VARIABLE = "QUEUEWORKER_TEST_DSN"


@pytest.fixture(scope="session")
def queueworker_server() -> Iterator[str]:
    """The URL of the server the test databases live on, as a role that may create databases."""
    given = os.environ.get(TEST_DSN_VARIABLE)
    if given:
        yield given
        return
    from ..dev.localpg import LocalPostgres

    server = LocalPostgres()
    try:
        yield server.start()
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def queueworker_template(queueworker_server: str) -> Iterator[str]:
    """The name of a database migrated once for this pytest process, which nobody may connect to
    (CREATE DATABASE ... TEMPLATE refuses a template with sessions); dropped at the end."""
    from ..db.migrate import migrate

    name = _create(queueworker_server, None)
    try:
        migrate(_dsn_of(queueworker_server, name))
        _admin(queueworker_server, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        yield name
    finally:
        _admin(queueworker_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def queueworker_dsn(queueworker_server: str, queueworker_template: str) -> Iterator[str]:
    """The URL of this test's own migrated database, a copy of the template; dropped after the test."""
    name = _create(queueworker_server, queueworker_template)
    try:
        yield _dsn_of(queueworker_server, name)
    finally:
        _admin(queueworker_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def queueworker_db(queueworker_dsn: str) -> Iterator[Any]:
    """A psycopg connection to this test's own migrated database, in autocommit mode (each
    statement commits, so `drain`'s worker sees what the test enqueued); closed after the test."""
    import psycopg

    with psycopg.connect(queueworker_dsn, autocommit=True) as conn:
        yield conn


def _create(server: str, template: str | None) -> str:
    name = f"queueworker_test_{uuid.uuid4().hex[:16]}"
    _admin(server, f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return name


def _dsn_of(server: str, database: str) -> str:
    from psycopg.conninfo import make_conninfo

    return make_conninfo(server, dbname=database)


def _admin(server: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(statement)
