"""A throwaway local Postgres server for tests, the demo and benchmarks.

Uses the system's server binaries when present (Debian's /usr/lib/postgresql/N/bin, or
pg_config on PATH), otherwise the ones shipped by the `pgserver` wheel from PyPI. Postgres
refuses to run as root, so as root the server runs as the `postgres` (or `nobody`) user.

Every connection needs the server's password, over TCP and over the unix socket alike
(scram-sha-256, never `trust`): with trust, any local user could connect as the superuser and,
with `COPY ... TO PROGRAM`, run commands as the account the server runs as. The password is
random per server and travels only inside `LocalPostgres.dsn`.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import random
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


class PostgresNotFound(RuntimeError):
    pass


def find_bin_dir() -> Path:
    """Where initdb, pg_ctl and postgres live; raises PostgresNotFound with what was tried."""
    candidates: list[Path] = []
    if os.environ.get("QUEUEWORKER_PG_BIN"):
        candidates.append(Path(os.environ["QUEUEWORKER_PG_BIN"]))
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    candidates += [Path(p) for p in debian]
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            candidates.append(Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                                  check=True).stdout.strip()))
        except subprocess.CalledProcessError:
            pass
    embedded = embedded_bin_dir()
    if embedded:
        candidates.append(embedded)
    for candidate in candidates:
        if all((candidate / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return candidate
    raise PostgresNotFound(
        "no Postgres server binaries found (tried $QUEUEWORKER_PG_BIN, /usr/lib/postgresql/*/bin, "
        "pg_config --bindir, the pgserver package): install postgresql, or the `embedded` extra "
        "(in a checkout: `pip install -e '.[embedded]'`)")


def embedded_bin_dir() -> Path | None:
    """The server binaries shipped inside the `pgserver` wheel, if it is installed."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"


# Ports handed out for servers we start: below the kernel's ephemeral range (where every outgoing
# connection takes its local port, so a port found free there can be taken before our server binds
# it) and below Kubernetes' NodePort range (30000-32767, which kube-proxy may hold).
LISTEN_PORTS = range(10000, 30000)

# Ports this process has handed out: a port found free stays free until its server binds it, so two
# calls in a row (etcd's client and peer ports) could otherwise get the same one.
_handed_out: set[int] = set()
_pick = random.SystemRandom()


def free_port() -> int:
    """A loopback port free now and not handed out before by this process, from LISTEN_PORTS where
    no outgoing connection can take it before the caller's server binds it; the kernel's choice if
    none of 200 tries is free."""
    for port in _pick.sample(LISTEN_PORTS, 200):
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class LocalPostgres:
    """initdb + pg_ctl in a temporary directory, on a free loopback port, password auth."""

    def __init__(self, bin_dir: Path | None = None, port: int | None = None, durable: bool = False,
                 extra_settings: dict[str, str] | None = None, base_dir: Path | None = None,
                 password: str | None = None, detached: bool = False):
        """`base_dir` and `password` reuse a server made before (its data directory is kept and started
        again); `detached` starts the server in a session of its own, so it outlives the process that
        started it and a Ctrl-C in that process's terminal."""
        self.bin_dir = bin_dir or find_bin_dir()
        self.port = port or free_port()
        self.durable = durable
        self.extra_settings = extra_settings or {}
        self.base_dir = base_dir or Path(tempfile.mkdtemp(prefix="queueworker-pg-"))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.base_dir / "data"
        self.log_file = self.base_dir / "postgres.log"
        self.detached = detached
        self._user = _server_user()
        self.password = password or secrets.token_urlsafe(24)  # URL-safe: goes into the DSN as it is
        if self._user is not None and self.data_dir.exists():
            self._make_binaries_reachable()

    @property
    def dsn(self) -> str:
        """The superuser's connection URL, password included: keep it out of logs and argv."""
        return f"postgresql://postgres:{self.password}@127.0.0.1:{self.port}/postgres"

    def start(self) -> str:
        if not self.data_dir.exists():
            self._initdb()
        self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.log_file))
        return self.dsn

    def is_running(self) -> bool:
        """Whether a server runs on the data directory (`pg_ctl status`)."""
        return self._run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "status"], check=False) == 0

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("stop", "-w", "-t", "60", "-m", mode)

    def restart(self) -> None:
        self.stop()
        self.start()

    def destroy(self) -> None:
        try:
            if (self.data_dir / "postmaster.pid").exists():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _initdb(self) -> None:
        if self._user is not None:
            shutil.chown(self.base_dir, self._user.pw_uid, self._user.pw_gid)
            self._make_binaries_reachable()
        password_file = self.base_dir / "password"
        descriptor = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(self.password + "\n")
        if self._user is not None:
            os.chown(password_file, self._user.pw_uid, self._user.pw_gid)
        try:
            self._run([str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
                       "--auth-host=scram-sha-256", "--auth-local=scram-sha-256", f"--pwfile={password_file}",
                       "--encoding=UTF8", "--no-instructions"])
        finally:
            password_file.unlink()
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.base_dir}'",
            "max_connections": "300",
            "shared_buffers": "256MB",
            "log_min_messages": "warning",
            "log_min_error_statement": "panic",
        }
        if not self.durable:
            settings.update({"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"})
        settings.update(self.extra_settings)
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.write("\n# queueworker LocalPostgres\n")
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    def _make_binaries_reachable(self) -> None:
        """As root, the server runs as another user, who may not reach binaries installed under a
        private directory (the pgserver wheel inside a venv in a 0700 checkout, say). Then copy
        that installation into our own directory, which that user owns."""
        try:
            self._run([str(self.bin_dir / "pg_ctl"), "--version"])
            return
        except PermissionError:
            pass
        install = self.bin_dir.parent    # site-packages/pgserver/pginstall
        package = install.parent
        copy = self.base_dir / "embedded" / package.name / install.name
        if copy.is_dir():  # made when this server's data directory was
            self.bin_dir = copy / self.bin_dir.name
            return
        shutil.copytree(install, copy, symlinks=True)
        # The wheel's vendored libraries, which its binaries find by RPATH $ORIGIN/../../../pgserver.libs.
        libs = package.parent / f"{package.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, self.base_dir / "embedded" / libs.name, symlinks=True)
        self.bin_dir = copy / self.bin_dir.name

    def _pg_ctl(self, *args: str) -> None:
        self._run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), *args])

    def _run(self, cmd: list[str], check: bool = True) -> int:
        result = subprocess.run(cmd, capture_output=True, text=True,
                                user=self._user.pw_uid if self._user else None,
                                group=self._user.pw_gid if self._user else None, cwd=self.base_dir,
                                start_new_session=self.detached)
        if result.returncode != 0 and check:
            raise RuntimeError(f"{Path(cmd[0]).name} {cmd[1:3]} failed ({result.returncode}): "
                               f"{result.stderr.strip() or result.stdout.strip()}\n{self.log_tail()}")
        return result.returncode


def _server_user() -> pwd.struct_passwd | None:
    """None when not root; otherwise the unprivileged account the server must run as."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise PostgresNotFound("running as root and neither a 'postgres' nor a 'nobody' user exists")
