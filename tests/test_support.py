"""The tests' own helpers (tests/support.py) where they hold more than a line of logic."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

from tests.conftest import create_database, drop_database
from tests.support import close_kept_connections, query, scalar

SESSION = "SELECT pg_backend_pid(), backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"


@pytest.mark.integration
def test_query_keeps_the_superusers_login_and_prepares_nothing(dsn):
    sessions = {query(dsn, SESSION)[0] for _ in range(6)}
    assert len(sessions) == 1
    assert scalar(dsn, "SELECT count(*) FROM pg_prepared_statements") == 0
    close_kept_connections()
    assert query(dsn, SESSION)[0] not in sessions


@pytest.mark.integration
def test_query_logs_in_anew_for_each_call_as_any_other_role(dsn):
    role, password = f"qw_probe_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
        try:
            role_dsn = psycopg.conninfo.make_conninfo(dsn, user=role, password=password)
            assert len({query(role_dsn, SESSION)[0] for _ in range(3)}) == 3
        finally:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.integration
def test_query_logs_in_again_when_the_server_ended_its_kept_connection(dsn):
    pid, _ = query(dsn, SESSION)[0]
    with psycopg.connect(dsn, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,)).fetchone()[0]
    assert query(dsn, SESSION)[0][0] != pid


ADMIN_SESSIONS = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND usename = current_user "
                  "AND backend_type = 'client backend' AND pid <> pg_backend_pid()")


@pytest.mark.integration
def test_creating_and_dropping_test_databases_keeps_one_login(postgres):
    _, admin_dsn = postgres
    drop_database(admin_dsn, create_database(admin_dsn))
    with psycopg.connect(admin_dsn, autocommit=True) as probe:
        before = {row[0] for row in probe.execute(ADMIN_SESSIONS)}
        assert before, "the login that made and dropped a database is kept"
        for _ in range(3):
            drop_database(admin_dsn, create_database(admin_dsn))
        assert {row[0] for row in probe.execute(ADMIN_SESSIONS)} == before
