"""`queueworker dev-db start|stop|url|status`: a Postgres for development that outlives the command.

One server per directory, $QUEUEWORKER_DEV_DB_DIR, else $XDG_DATA_HOME/queueworker/dev-db
(~/.local/share/queueworker/dev-db), or /var/lib/queueworker/dev-db as root, whose home the server's
unprivileged user cannot enter. `start` makes it on first use (initdb, a free loopback port, a random
password, fsync on: the data is meant to be kept) and starts it detached with pg_ctl; later starts reuse
its data. The port and password are kept in `dev-db.json` (mode 0600) beside the server's directory, so
`url` prints the same URL every time. The server is a `queueworker.dev.localpg.LocalPostgres`: password
auth on every connection, and as root it runs as the `postgres` (or `nobody`) user. The command
itself is queueworker.cli.local.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from .localpg import LocalPostgres

DIR_ENV = "QUEUEWORKER_DEV_DB_DIR"
STATE_FILE = "dev-db.json"
EXIT_NOT_RUNNING = 3  # as `pg_ctl status`


class DevDbError(Exception):
    """Why a dev-db command cannot do what it was asked: one line for the user."""


def default_dir() -> Path:
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV]).expanduser()
    if os.geteuid() == 0:
        return Path("/var/lib/queueworker/dev-db")
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "queueworker" / "dev-db"


class DevDb:
    """The development server kept in `directory`: `server/` is LocalPostgres's base directory."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.state_file = directory / STATE_FILE

    def _server(self) -> LocalPostgres:
        """The server, made if `directory` holds none yet (its port and password saved first)."""
        try:
            state = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._check_reachable_by_server_user()
            server = LocalPostgres(durable=True, base_dir=self.directory / "server", detached=True)
            descriptor = os.open(self.state_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as file:
                json.dump({"port": server.port, "password": server.password}, file)
            return server
        except (OSError, ValueError) as exc:
            raise DevDbError(f"cannot read {self.state_file}: {exc}") from None
        if not isinstance(state, dict) or not isinstance(state.get("port"), int) \
                or not isinstance(state.get("password"), str):
            raise DevDbError(f"{self.state_file} is not what `dev-db start` writes: delete {self.directory} "
                             "to start afresh")
        return LocalPostgres(durable=True, base_dir=self.directory / "server", port=state["port"],
                             password=state["password"], detached=True)

    def _check_reachable_by_server_user(self) -> None:
        """As root the server runs as an unprivileged user, who must be able to enter every parent."""
        if os.geteuid() != 0:
            return
        for parent in self.directory.resolve().parents:
            if not parent.stat().st_mode & 0o001:
                raise DevDbError(f"the server runs as an unprivileged user, who cannot enter {parent}: "
                                 f"set {DIR_ENV} to a directory outside it")

    def _lock(self):
        """Serializes dev-db commands on this directory (two `start`s must not both run initdb)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        lock = (self.directory / ".lock").open("w")
        fcntl.flock(lock, fcntl.LOCK_EX)
        return lock

    def _existing(self) -> LocalPostgres | None:
        return self._server() if self.state_file.exists() else None

    def start(self) -> tuple[LocalPostgres, bool]:
        """The running server, and whether this call started it."""
        with self._lock():
            server = self._server()
            if server.is_running():
                return server, False
            server.start()
            return server, True

    def stop(self) -> bool:
        """Whether a running server was stopped."""
        with self._lock():
            server = self._existing()
            if server is None or not server.is_running():
                return False
            server.stop()
            return True

    def running(self) -> LocalPostgres | None:
        with self._lock():
            server = self._existing()
            return server if server is not None and server.is_running() else None
