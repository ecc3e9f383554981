"""The database's connection budget, for real: a server of its own with max_connections 20, the
login roles of docs/database-roles.sql. The depth read brings the budget, counting the connections
of other roles by role (a client naming itself as the controller or a worker is still another
role's); a real worker process holds CONNECTIONS_PER_WORKER connections, never more, and a
completion that waits for a lock holds back none of its heartbeats; QueueWorkers on one database
share what is left (queueworker_controller.budget)."""

from __future__ import annotations

import asyncio
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql
from queueworker.client import operations
from queueworker.client.producer import enqueue, enqueue_many
from queueworker.db.migrate import migrate
from queueworker.dev.localpg import LocalPostgres, PostgresNotFound
from queueworker.runtime.worker import CONNECTIONS_PER_WORKER
from queueworker.scaling.policy import QueueDepth
from queueworker_controller.budget import ConnectionShares
from queueworker_controller.queuedb import CONTROLLER_CONNECTIONS, QueueDatabases

from tests.support import FAST_LEASES, WorkerProcess, query, scalar, wait_until

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parent.parent / "docs" / "database-roles.sql"
MAX_CONNECTIONS = 20
QUEUE = "budget"
LEASE = float(FAST_LEASES[FAST_LEASES.index("--lease-seconds") + 1])


@pytest.fixture(scope="module")
def small_server() -> Iterator[dict[str, str]]:
    """A migrated server with max_connections 20; URLs of its superuser (`admin`), of the workers'
    login (`app`, which the controller reads with too), of a login of another role (`other`), and of
    a worker login the server lets hold CONNECTIONS_PER_WORKER connections at most (`capped`)."""
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
            for name, groups, limit in (("app", ("queueworker_worker", "queueworker_controller"), -1),
                                        ("other", (), -1), ("capped", ("queueworker_worker",), CONNECTIONS_PER_WORKER)):
                password = secrets.token_urlsafe(18)
                conn.execute(pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {} CONNECTION LIMIT {}").format(
                    pgsql.Identifier(name), pgsql.Literal(password), pgsql.Literal(limit)))
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


class ConnectionSampler:
    """Counts a role's client backends in pg_stat_activity, over and over, on a thread of its own,
    leaving out backends it was told were terminated (they may linger a moment after their client
    has reconnected): the most it saw at once."""

    def __init__(self, admin: str, role: str):
        self._admin, self._role = admin, role
        self.terminated: set[int] = set()
        self.most = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with psycopg.connect(self._admin, autocommit=True) as conn:
            while not self._stop.is_set():
                pids = {pid for pid, in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE usename = %s AND backend_type = 'client backend'",
                    (self._role,))}
                self.most = max(self.most, len(pids - self.terminated))
                self.samples += 1


def test_a_worker_process_never_holds_more_than_connections_per_worker(small_server):
    """Start-up, a burst at concurrency 32 with checkpoints, idle, every connection terminated and
    made again, a drain: its login may hold CONNECTIONS_PER_WORKER connections and the server refuses
    one more, so a worker that ever opened a third would say so in its log (until its connections
    are terminated: the server may count a terminated backend a moment after the worker noticed).
    A sampler of pg_stat_activity watches the whole run too."""
    admin, capped = small_server["admin"], small_server["capped"]
    queue = "capped"
    with ConnectionSampler(admin, "capped") as sampler:
        worker = WorkerProcess(capped, "--queue", queue, "--concurrency", "32", "--handlers",
                               "tests.long_task_handlers")
        try:
            with psycopg.connect(admin) as conn:
                enqueue_many(conn, [{"task": "qw.noop", "queue": queue}] * 2000
                             + [{"task": "long.async_checkpoint", "queue": queue}] * 50)
            wait_until(lambda: state_counts_in(admin, queue) == {"succeeded": 2050}, timeout=120,
                       message="the burst to be done")
            assert "too many connections" not in worker.log(), worker.log()
            terminated = {pid for pid, in query(admin, "SELECT pid FROM pg_stat_activity WHERE usename = 'capped' "
                                                       "AND backend_type = 'client backend'")}
            assert 1 <= len(terminated) <= CONNECTIONS_PER_WORKER
            sampler.terminated |= terminated
            with psycopg.connect(admin, autocommit=True) as conn:
                for pid in terminated:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                enqueue_many(conn, [{"task": "qw.noop", "queue": queue}] * 200)
            wait_until(lambda: state_counts_in(admin, queue) == {"succeeded": 2250}, timeout=120,
                       message="the tasks enqueued after the connections were terminated")
            worker.signal(signal.SIGTERM)
            assert worker.wait(60) == 0, worker.log()
        finally:
            worker.stop()
    assert sampler.samples > 10
    assert sampler.most <= CONNECTIONS_PER_WORKER, f"{sampler.most} connections at once"


def state_counts_in(dsn: str, queue: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return dict(conn.execute("SELECT state::text, count(*) FROM queueworker.tasks WHERE queue = %s "
                                 "GROUP BY state", (queue,)).fetchall())


def test_a_completion_waiting_for_a_lock_holds_back_no_heartbeat(small_server, tmp_path):
    """The worker completes a task whose dependent's row another session has locked: the completion
    waits for that lock, holding its own task's row. Its heartbeats must go on extending the lease of
    a long task it runs meanwhile, past the moment the lease would have run out (a heartbeat that
    waited for the completion's row, or behind the completion, would let it run out: the fence would
    cancel the long task and a rescuer could run it twice)."""
    admin, capped = small_server["admin"], small_server["capped"]
    queue, parents = "blocked", "blocked-parents"
    release, report = tmp_path / "release", tmp_path / "report"
    with psycopg.connect(admin, autocommit=True) as conn:
        operations.pause(conn, parents)
        long_id = enqueue(conn, "long.until_released", {"release": str(release), "report": str(report)}, queue=queue)
        parent = enqueue(conn, "qw.noop", queue=parents)
        child = enqueue(conn, "qw.noop", queue=queue, depends_on=[parent])
    worker = WorkerProcess(capped, "--queue", queue, "--queue", parents, *FAST_LEASES, "--handlers",
                           "tests.long_task_handlers")
    try:
        wait_until(lambda: scalar(admin, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (long_id,))
                   == "running", message="the long task to run")
        with psycopg.connect(admin) as locker:  # a transaction holding the dependent's row
            locker.execute("SELECT 1 FROM queueworker.tasks WHERE id = %s FOR UPDATE", (child,))
            with psycopg.connect(admin, autocommit=True) as conn:
                operations.resume(conn, parents)
            blocked = wait_until(lambda: query(
                admin, "SELECT pid, query_start FROM pg_stat_activity WHERE usename = 'capped' "
                       "AND wait_event_type = 'Lock'"), message="the parent's completion to wait for the lock")
            [(pid, since)] = blocked
            # Each beat leases until now() + the lease: past `since` + two leases only by a beat
            # more than a lease after the completion began to wait.
            wait_until(lambda: scalar(admin, "SELECT leased_until > %s + make_interval(secs => %s) "
                                             "FROM queueworker.tasks WHERE id = %s", (since, 2 * LEASE, long_id)),
                       timeout=60, message="heartbeats extending the long task's lease while the completion waits")
            assert scalar(admin, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)) == "Lock"
            assert scalar(admin, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (parent,)) == "running"
            locker.rollback()
        release.touch()
        wait_until(lambda: state_counts_in(admin, queue) == {"succeeded": 2}, message="the long task and the child")
        assert scalar(admin, "SELECT attempts FROM queueworker.tasks WHERE id = %s", (long_id,)) == 1
        assert not report.exists(), report.read_text()
        assert "lease lost" not in worker.log() and "lease ran out" not in worker.log(), worker.log()
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.log()
    finally:
        worker.stop()
