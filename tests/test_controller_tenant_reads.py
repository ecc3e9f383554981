"""The shared controller survives its tenants' databases: reads bounded in rows and bytes whatever
the tables hold or the server sends, connects whose deadline includes the host name lookup and
whose lookups are per database, and database URLs that cannot make the controller open files."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import subprocess
import sys
import threading
import uuid

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from queueworker import dsn as dsn_text
from queueworker_controller import connector, queuedb
from queueworker_controller.reconcile import database_url
from tests.hanging_servers import FloodingPostgres
from tests.support import query, until
from tests.test_controller_queuedb import enqueue, run

pytestmark = pytest.mark.integration

MiB = 1 << 20


# --- what a URL may ask for ---------------------------------------------------------------------

@pytest.mark.parametrize("query, key", [
    ("passfile=/etc/passwd", "passfile"),
    ("service=prod", "service"),
    ("servicefile=/etc/passwd", "servicefile"),
    ("sslkey=/var/run/secrets/kubernetes.io/serviceaccount/token", "sslkey"),
    ("sslcert=/etc/hostname", "sslcert"),
    ("sslrootcert=/etc/hostname", "sslrootcert"),
    ("sslcrl=/etc/hostname", "sslcrl"),
    ("sslcrldir=/etc", "sslcrldir"),
    ("sslpassword=x", "sslpassword"),
    ("requirepeer=root", "requirepeer"),
    ("krbsrvname=postgres", "krbsrvname"),
    ("gssencmode=require", "gssencmode"),
    ("hostaddr=10.0.0.1", "hostaddr"),
])
def test_keys_that_reach_into_the_controllers_container_are_refused_with_their_reason(query, key):
    url = f"postgresql://app:hunter2-secret@db:5432/app?{query}"
    with pytest.raises(dsn_text.InvalidDsn) as refused:
        database_url(url.encode())
    reason = str(refused.value)
    assert key in reason and "\n" not in reason
    assert "hunter2" not in reason and "/etc" not in reason and "token" not in reason


@pytest.mark.parametrize("url, says", [
    ("postgresql://app:hunter2-secret@/app?host=/var/run/postgresql", "Unix socket"),
    ("postgresql://app:hunter2-secret@/app", "no host"),
    ("postgresql://app:hunter2-secret@a:1,b:2,c:3,d:4/app", "at most 3"),
    ("postgresql://app:hunter2-secret@a:1,b:2/app?port=1,2,3", "port count"),
    ("host=db port=70000 user=app password=hunter2-secret", "1-65535"),
])
def test_urls_that_name_sockets_or_many_servers_are_refused(url, says):
    with pytest.raises(dsn_text.InvalidDsn) as refused:
        database_url(url.encode())
    assert says in str(refused.value) and "hunter2" not in str(refused.value)


def test_ordinary_urls_are_accepted():
    for url in ("postgresql://app:pw@db:5432/app?sslmode=verify-full&sslrootcert=system",
                "postgresql://app:pw@db-a:5432,db-b:5433/app?target_session_attrs=read-write",
                "host=10.1.2.3 dbname=app user=app password=pw application_name=x connect_timeout=5"):
        assert database_url(url.encode()) == url


def test_a_refused_url_is_refused_at_connect_too():
    """QueueDatabases re-checks what it is given: nothing reaches libpq unchecked."""
    async def scenario(databases):
        url = "postgresql://app:pw@127.0.0.1:1/app?passfile=/etc/passwd"
        databases.bind("q", url, "q")
        return await asyncio.gather(databases.depth(url, "q", 1), return_exceptions=True)
    (outcome,) = run(scenario)
    assert isinstance(outcome, dsn_text.InvalidDsn) and "passfile" in str(outcome)


# --- host name lookups --------------------------------------------------------------------------

def with_host(dsn: str, host: str) -> str:
    return make_conninfo("", **{**conninfo_to_dict(dsn), "host": host})


@pytest.fixture
def hanging_resolver(monkeypatch):
    """Host names under `.hang.test` take until the test ends to resolve (a black-holed resolver);
    every other name resolves as usual. Yields the event that ends the hang."""
    released = threading.Event()
    resolve = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if isinstance(host, str) and host.endswith(".hang.test"):
            released.wait(120)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield released
    released.set()


def test_a_hanging_resolver_fails_its_own_connects_by_the_deadline_and_delays_no_other_database(
        dsn, hanging_resolver):
    """40 databases whose host names never resolve (more than any shared resolver pool has threads)
    and one healthy database named by host name: the healthy read answers while every lookup still
    hangs, and each hung read fails by the connect deadline, saying it timed out."""
    enqueue(dsn, "healthy", 3)
    healthy_dsn = with_host(dsn, "localhost")
    hung = [f"postgresql://app:pw@db{i}.hang.test:5432/app" for i in range(40)]

    async def scenario(databases):
        for i, url in enumerate(hung):
            databases.bind(f"hung-{i}", url, "q")
        databases.bind("healthy", healthy_dsn, "healthy")
        stuck = [asyncio.ensure_future(databases.depth(url, "q", 1)) for url in hung]
        healthy = await asyncio.wait_for(databases.depth(healthy_dsn, "healthy", 10), 30)
        healthy_while_hanging = not hanging_resolver.is_set()
        outcomes = await asyncio.wait_for(asyncio.gather(*stuck, return_exceptions=True), 30)
        return healthy, healthy_while_hanging, outcomes, not hanging_resolver.is_set()

    healthy, healthy_while_hanging, outcomes, failed_while_hanging = run(scenario)
    assert healthy.ready == 3 and healthy_while_hanging
    assert failed_while_hanging, "the hung reads ended by their deadline, not by the lookups ending"
    assert all(isinstance(o, psycopg.OperationalError) for o in outcomes), outcomes
    assert {dsn_text.explain(o, hung[0]).split(" ", 3)[-1] for o in outcomes} == {"timed out"}, outcomes


def test_connects_of_one_database_join_its_lookup_under_way(dsn, hanging_resolver, monkeypatch):
    """Ticks keep coming while a lookup hangs: they share it, they never queue threads behind it."""
    started = []
    look_up = connector._look_up
    monkeypatch.setattr(connector, "_look_up", lambda host, port: started.append(host) or look_up(host, port))
    url = "postgresql://app:pw@db.hang.test:5432/app"

    async def scenario(databases):
        databases.bind("q", url, "q")
        return await asyncio.gather(*(databases.depth(url, "q", 1) for _ in range(3)),
                                    databases.worker_leases(url, "ns", "q"), return_exceptions=True)
    outcomes = run(scenario)
    assert all(isinstance(o, psycopg.OperationalError) for o in outcomes)
    assert started == ["db.hang.test"]


# --- bounded reads ------------------------------------------------------------------------------

def add_workers(dsn: str, namespace: str, queue: str, count: int, pod_name_bytes: int) -> None:
    """Worker rows as any login of the database could register them, with pod names that long."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO queueworker.workers (id, hostname, pod_name, pod_namespace, pid, queues, concurrency, version)"
            " SELECT gen_random_uuid(), 'h', i || repeat('p', %s), %s, 1, ARRAY[%s], 1, 'x'"
            " FROM generate_series(1, %s) AS i", (pod_name_bytes, namespace, queue, count))


def test_worker_leases_are_read_bounded_whatever_the_table_holds(dsn):
    """A pod name of 100 MiB, and 5000 registered workers: at most 1000 rows are read, each pod name
    cut to Kubernetes' 253 characters."""
    huge, many = f"ns-{uuid.uuid4().hex[:8]}", f"ns-{uuid.uuid4().hex[:8]}"
    add_workers(dsn, huge, "big", 1, 100 * MiB)
    add_workers(dsn, many, "big", 5000, 300)

    async def scenario(databases):
        databases.bind("q", dsn, "big")
        return await databases.worker_leases(dsn, huge, "big"), await databases.worker_leases(dsn, many, "big")
    (cut,), leases = run(scenario)
    assert len(cut.pod_name) == 253
    assert len(leases) == 1000 and {len(lease.pod_name) for lease in leases} == {253}


CONTROLLER_READ = """
import asyncio, json, resource, sys
from queueworker import dsn as dsn_text
from queueworker_controller.queuedb import QueueDatabases

hostile, healthy = sys.argv[1], sys.argv[2]

async def main():
    databases = QueueDatabases()
    databases.bind("hostile", hostile, "q")
    databases.bind("healthy", healthy, "healthy")
    await databases.depth(healthy, "healthy", 10)  # warmed up: the baseline has what a read needs
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    hostile_read, healthy_read = await asyncio.gather(
        databases.worker_leases(hostile, "ns", "q"), databases.depth(healthy, "healthy", 10), return_exceptions=True)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    databases.close()
    print(json.dumps({"grown_kib": grown, "hostile": type(hostile_read).__name__,
                      "reason": dsn_text.explain(hostile_read, hostile) if isinstance(hostile_read, Exception) else "",
                      "healthy_ready": getattr(healthy_read, "ready", repr(healthy_read))}))

asyncio.run(main())
"""


def test_a_server_sending_a_huge_row_fails_that_read_with_a_reason_and_the_controller_stays_small(dsn):
    """A fake server answers the worker leases read with a 100 MiB row. In a controller process of
    its own, the read fails with a one-line reason, the healthy database's read still answers, and
    the process grows by a few MiB at most (libpq would otherwise hold the whole row, and Python a
    copy: about 300 MiB, past the chart's 256 Mi limit)."""
    enqueue(dsn, "healthy", 2)
    flooding = FloodingPostgres(row_bytes=100 * MiB)
    try:
        done = subprocess.run([sys.executable, "-c", CONTROLLER_READ, flooding.dsn(), dsn],
                              capture_output=True, text=True, timeout=120)
    finally:
        flooding.close()
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.splitlines()[-1])
    assert outcome["hostile"] == "ReadTooLarge", outcome
    assert re.fullmatch(r"the server sent more than \d+ KiB for one read: connection closed", outcome["reason"])
    assert outcome["healthy_ready"] == 2
    assert outcome["grown_kib"] < 32 * 1024, outcome
    assert flooding.sent < 100 * MiB, "the connection was cut before the row was whole"


def test_the_listen_connection_speaks_again_before_its_budget_runs_out(dsn, monkeypatch, caplog):
    """Notifications are one long exchange: past half the budget the listener runs its LISTEN again
    (a new exchange) instead of being cut, and tells its QueueWorkers to look, as after a reconnect."""
    monkeypatch.setattr(connector, "READ_BUDGET_BYTES", 16 * 1024)
    monkeypatch.setattr(queuedb, "READ_BUDGET_BYTES", 16 * 1024)
    caplog.set_level(logging.DEBUG, logger="queueworker_controller.queuedb")
    woken: list[float] = []

    def announce(batch: int, count: int) -> None:
        """`count` announcements of tasks due at epoch `batch`: ~140 bytes each on the wire."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(count):
                conn.execute("SELECT pg_notify('queueworker', %s)", (f"loud {batch}." + "0" * 100,))

    async def scenario(databases):
        databases.bind("q", dsn, "loud", notify=woken.append)
        await until(lambda: databases.listening(dsn), message="the LISTEN connection up")
        for batch in range(1, 11):  # 200 announcements, 20 at a time: ~28 KiB, each batch ~3 KiB
            heard = len(woken)
            await asyncio.to_thread(announce, batch, 20)
            # heard: an announcement of this batch, or a wake for everything after a renewed LISTEN
            await until(lambda: {float(batch), 0.0} & set(woken[heard:]), message=f"batch {batch} heard")
        return databases.listening(dsn)

    assert run(scenario)
    assert woken.count(0.0) >= 3, "woken on listening, and again on each renewed LISTEN"
    assert "LISTEN on" not in caplog.text, "never cut, never reconnected"


def test_cancel_requests_reach_the_server_through_the_relay(dsn):
    """libpq sends a cancel request on a connection of its own, to the address it connected to: the
    relay's port passes it on to the server (psycopg cancels a statement whose task is cancelled)."""
    async def scenario(databases):
        conn = await connector.Connector(dsn).connect("relay-cancel", "", connect_timeout=3, tcp_user_timeout_ms=15000)
        async with conn:
            sleeping = asyncio.ensure_future(conn.execute("SELECT pg_sleep(60)"))
            await until(lambda: asyncio.to_thread(
                lambda: query(dsn, "SELECT 1 FROM pg_stat_activity WHERE application_name = 'relay-cancel'"
                                   " AND state = 'active'")), message="the statement running")
            await conn.cancel_safe()
            with pytest.raises(psycopg.errors.QueryCanceled):
                await sleeping
            return await (await conn.execute("SELECT 1")).fetchone()
    assert run(scenario) == (1,)


def test_a_depth_read_of_many_queues_is_not_cut_for_its_size(dsn):
    """The byte budget grows with the rows a read may return: 8000 queues with long names, read
    together in one depth batch (about 1.6 MiB of rows), are answered."""
    queues = [f"{i:04d}-" + "q" * 120 for i in range(8000)]

    async def scenario(databases):
        for queue in queues:
            databases.bind(queue, dsn, queue)
        return await asyncio.gather(*(databases.depth(dsn, queue, 1) for queue in queues))
    assert [depth.ready for depth in run(scenario)] == [0] * 8000


def test_a_closed_relay_leaves_nothing_behind_that_the_next_socket_could_inherit():
    """A relay closed while its pumps wait on their sockets (the attempt after a PgBouncer refused the
    startup options does this) must not leave the loop's selector holding their descriptors: the next
    socket given the same number would fail its first wait with "No such file or directory"."""
    async def main() -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(100):
                writer.write(data)
                await writer.drain()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        address = server.sockets[0].getsockname()
        loop = asyncio.get_running_loop()
        try:
            for _ in range(20):
                relay = await connector._Relay.open("127.0.0.1", socket.AF_INET, address)
                with socket.create_connection(("127.0.0.1", relay.port)) as client:
                    client.setblocking(False)
                    await loop.sock_sendall(client, b"x")
                    assert await asyncio.wait_for(loop.sock_recv(client, 1), 10) == b"x"  # both pumps now wait
                    relay.close()
                    fresh = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(3)]
                    try:
                        for sock in fresh:  # the lowest free descriptors: the relay's
                            sock.setblocking(False)
                            await asyncio.wait_for(loop.sock_connect(sock, address), 10)
                    finally:
                        for sock in fresh:
                            sock.close()
                await asyncio.sleep(0)
        finally:
            server.close()
    asyncio.run(main())
