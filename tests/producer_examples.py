"""The SQL producer examples of examples/producers/, run for real: the Node one with the `pg`
package installed from npm, the Go one with `go run` (pgx from the Go module proxy). The npm
install is made once per machine for each version of package.json and package-lock.json, in a
cache directory keyed by them (next to the other tests' caches); Go keeps its module and build
caches there too, so a warm run only links. Without node, npm or go, or without the registries,
the tests that need them skip with the reason, and fail instead in CI (CI=true)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from tests.cluster.binaries import cache_root
from tests.go_tools import _go as find_go

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "producers"
NODE_EXAMPLE = EXAMPLES / "node"
GO_EXAMPLE = EXAMPLES / "go"


def unavailable(reason: str) -> None:
    """Skips the test with `reason`, or fails it in CI, where every tier must run."""
    if os.environ.get("CI") == "true" or os.environ.get("QUEUEWORKER_REQUIRE_CLUSTER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _digest(*files: Path) -> str:
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:12]


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.splitlines()[-lines:])


# What npm and go say when the registry or the module proxy cannot be reached (anything else that
# fails is the example's fault, and fails the test).
_UNREACHABLE = ("ENOTFOUND", "EAI_AGAIN", "ETIMEDOUT", "ECONNREFUSED", "ECONNRESET", "dial tcp", "no such host",
                "i/o timeout", "TLS handshake timeout", "connection refused")


def _build_failed(what: str, log: str) -> None:
    message = f"{what} failed:\n{_tail(log)}"
    if any(sign in log for sign in _UNREACHABLE):
        unavailable(message)
    pytest.fail(message)


def node_modules() -> Path:
    """The example's node_modules (`npm ci` from its lock file), installed once per lock file."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        unavailable("node and npm are needed to run examples/producers/node (Debian: apt-get install nodejs npm)")
    manifest = [NODE_EXAMPLE / "package.json", NODE_EXAMPLE / "package-lock.json"]
    target = cache_root() / "npm" / f"producers-node-{_digest(*manifest)}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "node_modules" / "pg" / "package.json").is_file():
            return target / "node_modules"
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
        for file in manifest:
            shutil.copy(file, staging / file.name)
        done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=staging,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            _build_failed("`npm ci` for examples/producers/node", done.stderr)
        staging.rename(target)
    return target / "node_modules"


def database_url(dsn: str) -> str:
    """`dsn` (psycopg's key=value form, or a URL) as a postgresql:// URL, the form every client takes."""
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    auth = quote(parts["user"], safe="") + (f":{quote(parts['password'], safe='')}" if parts.get("password") else "")
    return f"postgresql://{auth}@{parts.get('host', '127.0.0.1')}:{parts.get('port', 5432)}/{quote(parts['dbname'])}"


def run_node_example(dsn: str, *args: str) -> subprocess.CompletedProcess:
    """`node enqueue.js ARGS` as a producer runs it, its `pg` from the cached install."""
    modules = node_modules()
    return subprocess.run(["node", str(NODE_EXAMPLE / "enqueue.js"), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "DATABASE_URL": database_url(dsn), "NODE_PATH": str(modules)})


def run_go_example(dsn: str, *args: str) -> subprocess.CompletedProcess:
    """`go run . ARGS` in examples/producers/go, with the module and build caches kept in the cache
    directory."""
    go = find_go()
    if go is None:
        unavailable("go is needed to run examples/producers/go (https://go.dev/dl/, or Debian's golang-go)")
    caches = cache_root() / "go"
    env = {**os.environ, "DATABASE_URL": database_url(dsn), "GOTOOLCHAIN": "local", "GOWORK": "off", "CGO_ENABLED": "0",
           "GOFLAGS": "-mod=readonly", "GOMODCACHE": str(caches / "mod"), "GOCACHE": str(caches / "build")}
    done = subprocess.run([go, "run", ".", *args], cwd=GO_EXAMPLE, capture_output=True, text=True, timeout=600,
                          env=env)
    if done.returncode != 0 and "enqueue failed" not in done.stderr:  # the build, not the program
        _build_failed("`go run` of examples/producers/go", done.stderr)
    return done
