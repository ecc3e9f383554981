"""Shared fixtures: a real Postgres for the integration tier, the control plane and the QueueWorker
CRD for the cluster tier, a container engine and the images for the image tier."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from queueworker.dev.localpg import LocalPostgres, PostgresNotFound
from queueworker.db.migrate import migrate
from tests.cluster.fixtures import (  # noqa: F401
    cluster_namespace, control_plane, crd, node_postgres, real_node, real_node_namespace,
)
from tests.containers.fixtures import container_engine, images  # noqa: F401
from tests.parallel import (  # noqa: F401 - the hooks that share the machine between pytest processes
    pytest_collection_modifyitems, pytest_runtest_teardown, pytest_xdist_make_scheduler,
)
from tests.support import admin_execute, close_kept_connections
from tests.pgbouncer import pgbouncer, pgbouncer_blank_dsn, pgbouncer_dsn  # noqa: F401


@pytest.fixture(autouse=True)
def kept_connections_closed() -> Iterator[None]:
    """The connections `tests.support.query` keeps last one test at most."""
    yield
    close_kept_connections()


@pytest.fixture(scope="session")
def postgres():
    """A Postgres server for the session: $QUEUEWORKER_TEST_DSN if set, otherwise a throwaway
    local server started here (system binaries, else the pgserver wheel). Yields the
    LocalPostgres (or None for an external server) and its admin DSN."""
    external = os.environ.get("QUEUEWORKER_TEST_DSN")
    if external:
        yield None, external
        return
    try:
        server = LocalPostgres()
    except PostgresNotFound as exc:
        pytest.fail(str(exc)) if os.environ.get("CI") else pytest.skip(str(exc))
    server.start()
    try:
        yield server, server.dsn
    finally:
        server.destroy()


@pytest.fixture
def local_postgres(postgres):
    """The local server itself, for tests that stop and restart it."""
    server, _ = postgres
    if server is None:
        pytest.skip("needs a server started by the test setup (QUEUEWORKER_TEST_DSN is set)")
    return server


# How a test's database is copied from the migrated template. Measured on Postgres 15 with this
# suite's server settings (fsync off), 2026-11-27: see docs/testing.md.
CLONE_STRATEGY = "WAL_LOG"


def create_database(admin_dsn: str, template: str | None = None) -> str:
    """A new database, a copy of `template` (else of template1); its name."""
    name = f"qw_test_{uuid.uuid4().hex[:12]}"
    copy = f' TEMPLATE "{template}" STRATEGY {CLONE_STRATEGY}' if template else ""
    admin_execute(admin_dsn, f'CREATE DATABASE "{name}"{copy}')
    return name


def drop_database(admin_dsn: str, name: str) -> None:
    close_kept_connections()
    admin_execute(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def owned_database(admin_dsn: str, name: str) -> Iterator[str]:
    """The DSN of database `name`, which is dropped afterwards."""
    try:
        yield psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
    finally:
        drop_database(admin_dsn, name)


def throwaway_database(admin_dsn: str, template: str | None = None) -> contextlib.AbstractContextManager[str]:
    """A new database (a copy of `template`, else of template1), dropped afterwards; its DSN."""
    return owned_database(admin_dsn, create_database(admin_dsn, template))


class CopiesAhead:
    """Copies of the migrated template, each made one test ahead on a thread of its own: making a
    copy is most of a short test's setup, and overlaps the test before it this way. A copy nobody
    has connected to is as fresh as one made at the test's start."""

    def __init__(self, admin_dsn: str, template: str):
        self._admin_dsn, self._template = admin_dsn, template
        self._maker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="template-copies")
        self._next = self._maker.submit(create_database, admin_dsn, template)

    def take(self) -> str:
        """The copy made ahead (made now if making it failed: the server was restarting, say); the
        next one is started."""
        made, self._next = self._next, self._maker.submit(create_database, self._admin_dsn, self._template)
        try:
            return made.result()
        except psycopg.Error:
            return create_database(self._admin_dsn, self._template)

    def close(self) -> None:
        self._maker.shutdown(wait=True)
        if self._next.exception() is None:
            drop_database(self._admin_dsn, self._next.result())


@pytest.fixture(scope="session")
def migrated_template(postgres):
    """The name of a database migrated once per session, which `dsn` copies for each test. Nobody
    may connect to it once migrated (ALLOW_CONNECTIONS false): CREATE DATABASE ... TEMPLATE
    refuses a template that has other sessions, and a test's change must never reach the next test."""
    _, admin_dsn = postgres
    with throwaway_database(admin_dsn) as template_dsn:
        migrate(template_dsn)
        name = psycopg.conninfo.conninfo_to_dict(template_dsn)["dbname"]
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        yield name


@pytest.fixture(scope="session")
def template_copies(postgres, migrated_template):
    """Where `dsn` takes its copies; the one made ahead and not taken is dropped at the end."""
    _, admin_dsn = postgres
    copies = CopiesAhead(admin_dsn, migrated_template)
    try:
        yield copies
    finally:
        copies.close()


@pytest.fixture
def blank_dsn(postgres):
    """A fresh, empty (unmigrated) database per test, dropped afterwards."""
    _, admin_dsn = postgres
    with throwaway_database(admin_dsn) as url:
        yield url


@pytest.fixture
def dsn(postgres, template_copies):
    """A fresh, migrated database per test (a copy of the session's migrated template), dropped afterwards."""
    _, admin_dsn = postgres
    with owned_database(admin_dsn, template_copies.take()) as url:
        yield url


@pytest.fixture(scope="module")
def module_dsn(postgres, template_copies):
    """One migrated database for all the tests of a module, dropped after them: for tests that change
    nothing another could see (they prepare and describe statements, or roll back what they do)."""
    _, admin_dsn = postgres
    with owned_database(admin_dsn, template_copies.take()) as url:
        yield url


@pytest.fixture(scope="session")
def controller_kubeconfig(control_plane, crd, tmp_path_factory):
    """The controller's kubeconfig on the process-kubelet cluster: its ServiceAccount with exactly
    the chart's rules (one per session, shared by every module that runs the controller)."""
    from tests.controller_cluster import write_controller_kubeconfig
    return write_controller_kubeconfig(control_plane, tmp_path_factory.mktemp("controller") / "kubeconfig")
