"""A running Docker engine for the image tier: the machine's own, or one started here.

`docker info` decides whether an engine runs: a `docker` on PATH may be a client without a daemon.
When none runs and we are root on Debian, Debian's docker.io is installed with apt and `dockerd`
is started in the background with its data root, pidfile and log under the project's cache dir
(`ENGINE_DIR`). It is left running, so the next session (and the other tiers, which load these
images) find it at once; `python -m tests.containers stop-engine` stops it.

Engine on Debian 12 is dockerd 20.10: no BuildKit (`docker build` is the legacy builder) and no
`--privileged` on machines whose capability bounding set is short (moby#42906); unprivileged
containers, host networking and the hardening flags work.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.binaries import cache_root

from . import ContainersUnavailable
from .debian import ensure_packages

DEBIAN_CLIENT = "/usr/bin/docker"
DEBIAN_DAEMON = "/usr/sbin/dockerd"
START_TIMEOUT = 90.0


def engine_dir() -> Path:
    """Where the engine started here keeps its images (`data`), `dockerd.pid` and `dockerd.log`."""
    return cache_root() / "docker"


class DockerError(RuntimeError):
    """A docker command failed; the message holds the command and the tail of its output."""


@dataclass(frozen=True)
class Engine:
    """A docker client whose `docker info` succeeded."""

    client: str

    def run(self, *args: str, timeout: float = 300, check: bool = True,
            **kwargs) -> subprocess.CompletedProcess[str]:
        """`docker ARGS...` with its output captured; raises DockerError on a non-zero exit when `check`."""
        env = {**os.environ, "DOCKER_BUILDKIT": "0", **kwargs.pop("env", {})}
        result = subprocess.run([self.client, *args], capture_output=True, text=True, timeout=timeout,
                                env=env, **kwargs)
        if check and result.returncode != 0:
            output = (result.stdout[-2000:] + "\n" + result.stderr[-3000:]).strip()
            raise DockerError(f"`docker {' '.join(args)}` exited {result.returncode}:\n{output}")
        return result


def _working_client(client: str) -> tuple[bool, str]:
    """Whether `client info` reaches a daemon, and the first line of its complaint when it does not."""
    try:
        result = subprocess.run([client, "info"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    # The 20.10 client prints its error among the info on stdout, newer ones on stderr.
    complaints = [line.strip() for line in (result.stderr + result.stdout).splitlines()
                  if re.search(r"error|cannot|denied|refused", line, re.IGNORECASE)
                  and not line.startswith("WARNING") and "pretty printing" not in line]
    return result.returncode == 0, complaints[0] if complaints else f"exit {result.returncode}"


def find_engine() -> tuple[Engine | None, str]:
    """The first client, of PATH's `docker` and Debian's, that reaches a running daemon; else
    None and why not (what the last client tried said)."""
    why = "no docker client installed"
    for client in dict.fromkeys(c for c in (shutil.which("docker"), DEBIAN_CLIENT) if c and os.access(c, os.X_OK)):
        ok, complaint = _working_client(client)
        if ok:
            return Engine(client), ""
        why = f"`{client} info`: {complaint}"
    return None, why


def ensure_engine() -> Engine:
    """A client of a running engine; installs and starts one (see the module's docstring) when
    none runs. Raises ContainersUnavailable, with the reason, where that cannot be done."""
    engine, why = find_engine()
    if engine is not None:
        return engine
    if os.geteuid() != 0:
        raise ContainersUnavailable(f"no running Docker engine ({why}), and starting one needs root")
    ensure_packages("docker.io", "iptables")
    directory = engine_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions starting at once: the second finds the first's
        engine, _ = find_engine()
        return engine or _start_dockerd(directory)


def _start_dockerd(directory: Path) -> Engine:
    log = directory / "dockerd.log"
    with log.open("a") as out:
        out.write(f"--- starting dockerd at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        out.flush()
        daemon = subprocess.Popen(
            [DEBIAN_DAEMON, "--data-root", str(directory / "data"), "--pidfile", str(directory / "dockerd.pid")],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if _working_client(DEBIAN_CLIENT)[0]:
            return Engine(DEBIAN_CLIENT)
        if daemon.poll() is not None:
            break
        time.sleep(0.5)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    if daemon.poll() is None:
        daemon.terminate()
    raise ContainersUnavailable(f"dockerd did not become ready (exit {daemon.poll()}; log {log}):\n{tail}")


def stop_engine(timeout: float = 30) -> bool:
    """Stops the dockerd that `ensure_engine` started (found by its pidfile), not any other.
    Returns whether one was running."""
    pidfile = engine_dir() / "dockerd.pid"
    try:
        pid = int(pidfile.read_text().strip())
        if Path(f"/proc/{pid}/comm").read_text().strip() != "dockerd":
            return False
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return False
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)
    return True
