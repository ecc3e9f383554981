"""The database's connection budget, for real: a server of its own with max_connections 20, the
login roles of docs/database-roles.sql. The depth read brings the budget, counting the connections
of other roles by role (a client naming itself as the controller or a worker is still another
role's); a real worker process holds CONNECTIONS_PER_WORKER connections; QueueWorkers on one
database share what is left (queueworker_controller.budget)."""

from __future__ import annotations

import asyncio
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql
from queueworker.client.producer import enqueue
from queueworker.db.migrate import migrate
from queueworker.dev.localpg import LocalPostgres, PostgresNotFound
from queueworker.runtime.worker import CONNECTIONS_PER_WORKER
from queueworker.scaling.policy import QueueDepth
from queueworker_controller.budget import ConnectionShares
from queueworker_controller.queuedb import CONTROLLER_CONNECTIONS, QueueDatabases

from tests.support import WorkerProcess, scalar, wait_until

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parent.parent / "docs" / "database-roles.sql"
MAX_CONNECTIONS = 20
QUEUE = "budget"


@pytest.fixture(scope="module")
def small_server() -> Iterator[dict[str, str]]:
    """A migrated server with max_connections 20; URLs of its superuser (`admin`), of the workers'
    login (`app`, which the controller reads with too) and of a login of another role (`other`)."""
    try:
        server = LocalPostgres(extra_settings={"max_connections": str(MAX_CONNECTIONS)})
    except PostgresNotFound as exc:
        pytest.skip(str(exc))
    server.start()
    try:
        migrate(server.dsn)
        urls = {"admin": server.dsn}
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute(SCRIPT.read_text())
            for name, groups in (("app", ("queueworker_worker", "queueworker_controller")), ("other", ())):
                password = secrets.token_urlsafe(18)
                conn.execute(pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    pgsql.Identifier(name), pgsql.Literal(password)))
                for group in groups:
                    conn.execute(pgsql.SQL("GRANT {} TO {}").format(pgsql.Identifier(group), pgsql.Identifier(name)))
                urls[name] = psycopg.conninfo.make_conninfo(server.dsn, user=name, password=password)
        yield urls
    finally:
        server.destroy()


def read_depth(dsn: str) -> QueueDepth:
    async def main() -> QueueDepth:
        databases = QueueDatabases()
        try:
            databases.bind("qw", dsn, QUEUE)
            return await databases.depth(dsn, QUEUE, 10)
        finally:
            databases.close()
    return asyncio.run(main())


def test_the_depth_read_brings_the_budget_and_counts_other_roles_by_role(small_server):
    """max_connections less the reserved slots; the client backends of other roles, those that name
    themselves as the controller or a worker included, and none of the login's own role."""
    admin, app, other = small_server["admin"], small_server["app"], small_server["other"]
    reserved = scalar(admin, "SELECT current_setting('superuser_reserved_connections')::int "
                             "+ coalesce(current_setting('reserved_connections', true)::int, 0)")
    before = read_depth(app)
    assert before.connection_limit == MAX_CONNECTIONS - reserved
    spoofing = [psycopg.connect(other, application_name=name) for name in
                ("queueworker-controller", "queueworker-claim", "queueworker-listen")]
    own = [psycopg.connect(app, application_name="anything") for _ in range(2)]
    try:
        during = read_depth(app)
        assert during.other_role_connections == before.other_role_connections + len(spoofing)
    finally:
        for conn in spoofing + own:
            conn.close()
    wait_until(lambda: read_depth(app).other_role_connections == before.other_role_connections,
               message="the other role's connections to end")

    shares = ConnectionShares()
    free = before.connection_limit - before.other_role_connections - CONTROLLER_CONNECTIONS
    assert free > CONNECTIONS_PER_WORKER
    assert shares.with_budget(app, "a", before, None).connection_budget == free
    shares.hold(app, "b", CONNECTIONS_PER_WORKER)  # another QueueWorker's replica
    shares.hold(app, "a", 5 * CONNECTIONS_PER_WORKER)  # its own replicas are not taken from its budget
    assert shares.with_budget(app, "a", before, None).connection_budget == free - CONNECTIONS_PER_WORKER
    assert shares.with_budget(app, "a", before, 4).connection_budget == 4  # spec.database.maxConnections
    shares.release("b")
    assert shares.with_budget(app, "a", before, None).connection_budget == free


def test_a_worker_process_holds_connections_per_worker(small_server):
    """What the budget counts a worker process as: its connections, the checkpoint one included,
    measured in pg_stat_activity (its login is a role of its own here)."""
    admin, app = small_server["admin"], small_server["app"]
    with psycopg.connect(app, autocommit=True) as conn:
        task_id = enqueue(conn, "long.async_checkpoint", queue=QUEUE)
    worker = WorkerProcess(app, "--queue", QUEUE, "--handlers", "tests.long_task_handlers")
    try:
        wait_until(lambda: scalar(admin, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (task_id,))
                   == "succeeded", message="the checkpointing task")
        held = wait_until(lambda: scalar(admin, "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app' "
                                                "AND backend_type = 'client backend'") == CONNECTIONS_PER_WORKER,
                          message=f"the worker's {CONNECTIONS_PER_WORKER} connections")
        assert held
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.log()
    finally:
        worker.stop()
