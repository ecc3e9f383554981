"""Debian's PgBouncer in transaction pooling mode, in front of the test Postgres.

Few server connections are shared by every client, so anything a client leaves on a server
connection (a prepared statement, a LISTEN, a session setting, an advisory lock) shows up in
another client's transaction, as it would in production. PgBouncer refuses to run as root: then
it runs as the `postgres` user, in a throwaway directory of its own.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import urllib.parse
from pathlib import Path

import psycopg
import pytest

from queueworker.dev.localpg import free_port
from tests.support import wait_until

# Small, so that clients take turns on the same server connections.
POOL_SIZE = 3
START_SECONDS = 30.0
CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def find_pgbouncer() -> str | None:
    return shutil.which("pgbouncer") or next((path for path in CANDIDATES if os.access(path, os.X_OK)), None)


class PgBouncer:
    """pgbouncer on a free loopback port, forwarding every database name to one Postgres server
    as that server's user (clients need no password: auth_type any)."""

    def __init__(self, binary: str, server_dsn: str, pool_size: int = POOL_SIZE):
        server = psycopg.conninfo.conninfo_to_dict(server_dsn)
        self.port = free_port()
        self.base_dir = Path(tempfile.mkdtemp(prefix="queueworker-pgbouncer-"))
        self._user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        target = " ".join(f"{key}={value}" for key, value in (
            ("host", server.get("host", "127.0.0.1")), ("port", server.get("port", 5432)),
            ("user", server["user"]), ("password", server["password"])))
        self.config = self.base_dir / "pgbouncer.ini"
        self.config.write_text(f"""[databases]
* = {target}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
max_db_connections = {pool_size}
server_lifetime = 3600
logfile = {self.base_dir / 'pgbouncer.log'}
pidfile = {self.base_dir / 'pgbouncer.pid'}
""")
        self.config.chmod(0o600)  # the server's password is in it
        if self._user is not None:
            for path in (self.base_dir, self.config):
                os.chown(path, self._user.pw_uid, self._user.pw_gid)
        self._process = subprocess.Popen([binary, str(self.config)], cwd=self.base_dir,
                                         user=self._user.pw_uid if self._user else None,
                                         group=self._user.pw_gid if self._user else None,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_until_listening()

    def dsn_for(self, direct_dsn: str) -> str:
        """The URL reaching `direct_dsn`'s database through this PgBouncer (no password needed)."""
        dbname = psycopg.conninfo.conninfo_to_dict(direct_dsn)["dbname"]
        return f"postgresql://postgres@127.0.0.1:{self.port}/{urllib.parse.quote(dbname)}"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join((self.base_dir / "pgbouncer.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _wait_until_listening(self) -> None:
        try:
            wait_until(self._listening, timeout=START_SECONDS, message="pgbouncer to listen")
        except AssertionError as exc:
            self.stop()
            raise RuntimeError(f"{exc}\n{self.log_tail()}") from None

    def _listening(self) -> bool:
        if self._process.poll() is not None:
            raise RuntimeError(f"pgbouncer exited ({self._process.returncode}): "
                               f"{self._process.stderr.read().decode(errors='replace')}\n{self.log_tail()}")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process.stderr.close()
        shutil.rmtree(self.base_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def pgbouncer(postgres):
    """PgBouncer in transaction pooling mode in front of the session's Postgres. Without the
    binary the test is skipped, or fails in CI."""
    binary = find_pgbouncer()
    if binary is None:
        reason = "pgbouncer is not installed (apt-get install pgbouncer)"
        if os.environ.get("CI") == "true" or os.environ.get("QUEUEWORKER_REQUIRE_CLUSTER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    _, admin_dsn = postgres
    bouncer = PgBouncer(binary, admin_dsn)
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture
def pgbouncer_blank_dsn(pgbouncer, blank_dsn):
    """A fresh, empty database per test, reached through PgBouncer."""
    return pgbouncer.dsn_for(blank_dsn)


@pytest.fixture
def pgbouncer_dsn(pgbouncer, dsn):
    """A fresh, migrated database per test, reached through PgBouncer."""
    return pgbouncer.dsn_for(dsn)
