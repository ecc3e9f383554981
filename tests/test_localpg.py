"""The throwaway Postgres used by tests and the demo, including the PyPI fallback."""

import psycopg
import pytest

from queueworker.dev.demo import DemoConfig, WorkerFleet
from queueworker.dev.localpg import LISTEN_PORTS, LocalPostgres, embedded_bin_dir, free_port
from queueworker.db.migrate import migrate


@pytest.mark.integration
def test_embedded_postgres_from_pypi_starts_and_migrates():
    bin_dir = embedded_bin_dir()
    if bin_dir is None:
        pytest.skip("the pgserver wheel is not installed (pip install -e '.[test]')")
    server = LocalPostgres(bin_dir=bin_dir)
    try:
        dsn = server.start()
        migrate(dsn)
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM queueworker.tasks").fetchone()[0] == 0
            assert conn.info.server_version >= 140000
    finally:
        server.destroy()


@pytest.mark.integration
def test_every_connection_needs_the_servers_password(local_postgres, monkeypatch):
    """No `trust` anywhere: without the password nobody connects, over TCP or the unix socket."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", "/nonexistent")
    server = local_postgres
    tcp = {"host": "127.0.0.1", "port": server.port, "user": "postgres", "dbname": "postgres", "connect_timeout": 5}
    socket = dict(tcp, host=str(server.base_dir))
    for params in (tcp, socket):
        with pytest.raises(psycopg.OperationalError, match="no password supplied"):
            psycopg.connect(**params)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(**params, password=server.password[::-1])
        with psycopg.connect(**params, password=server.password) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    with psycopg.connect(server.dsn) as conn:
        methods = {row[0] for row in conn.execute("SELECT auth_method FROM pg_hba_file_rules")}
    assert methods == {"scram-sha-256"}


def test_demo_workers_get_the_dsn_by_environment_not_argv(tmp_path):
    """A password in a command line is readable by every local user (ps, /proc/PID/cmdline)."""
    fleet = WorkerFleet("postgresql://postgres:s3cret-pass@127.0.0.1:5432/postgres", DemoConfig(), tmp_path)
    assert not any("s3cret-pass" in arg for arg in fleet.command())
    assert fleet.environment()["DATABASE_URL"] == fleet.dsn


def test_free_port_never_hands_out_the_same_port_twice():
    """A control plane asks for seven ports before any server binds one: by the birthday bound,
    3,000 draws from LISTEN_PORTS would repeat a port almost surely if draws were independent."""
    ports = [free_port() for _ in range(3000)]
    assert len(set(ports)) == len(ports)
    assert all(port in LISTEN_PORTS for port in ports)

