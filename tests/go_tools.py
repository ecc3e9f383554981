"""helm and kind, built from the Go module proxy once per machine, like the control plane binaries.

Each lands in a cache directory keyed by its version, so a warm machine reuses it and a change of
pin builds anew. Without the Makefile's ldflags a `go install`ed helm reports `v3.21` and defaults
`.Capabilities.KubeVersion` to v1.20.0, so its stamps matter (shared notes, control-plane §10).

    python -m tests.go_tools helm    # builds if needed, prints the path (also: kind)
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.binaries import K8S_VERSION, BinariesUnavailable, cache_root


@dataclass(frozen=True)
class GoTool:
    name: str
    package: str  # the main package, installed as PACKAGE@VERSION
    version: str
    version_args: tuple[str, ...]  # `NAME ARGS...` prints a line holding `version`
    ldflags: str = "-s -w"
    cache_key: str = ""  # anything else the build depends on

    def path(self) -> Path:
        return cache_root() / "bin" / f"{self.name}-{self.version}{self.cache_key}" / self.name

    def is_current(self, path: Path) -> bool:
        if not os.access(path, os.X_OK):
            return False
        try:
            out = subprocess.run([path, *self.version_args], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return False
        return self.version in out.split()


_K8S_MAJOR, _K8S_MINOR = K8S_VERSION.split(".")[:2]
HELM = GoTool(
    "helm", "helm.sh/helm/v3/cmd/helm", "v3.21.4", ("version", "--template", "{{.Version}}"),
    ldflags=" ".join([
        "-s -w -X helm.sh/helm/v3/internal/version.version=v3.21.4",
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
        *(f"-X helm.sh/helm/v3/pkg/{pkg}.k8sVersion{part}={value}"
          for pkg in ("chartutil", "lint/rules") for part, value in (("Major", _K8S_MAJOR), ("Minor", _K8S_MINOR))),
    ]),
    cache_key=f"-k8s-v{K8S_VERSION}")
KIND = GoTool("kind", "sigs.k8s.io/kind", "v0.32.0", ("version",))
TOOLS = {tool.name: tool for tool in (HELM, KIND)}


def _go() -> str | None:
    return shutil.which("go") or next((p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go")
                                       if os.access(p, os.X_OK)), None)


def ensure(tool: GoTool) -> Path:
    """The path of the pinned build of `tool`, built with `go install` if missing or stale.

    Raises BinariesUnavailable (with the build log's tail) when Go or the module proxy is missing.
    Concurrent callers serialize on a lock file.
    """
    target = tool.path()
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tool.is_current(target):
            return target
        go = _go()
        if go is None:
            raise BinariesUnavailable(f"`go` is not on PATH, so {tool.name} cannot be built")
        staging = directory / ".gobin"
        env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOWORK": "off", "GOFLAGS": "-trimpath",
               "GOBIN": str(staging)}
        cmd = [go, "install", "-ldflags", tool.ldflags, f"{tool.package}@{tool.version}"]
        log = directory / "build.log"
        print(f"building {tool.name} {tool.version} with `go install` into {directory} (a few minutes cold; "
              f"log {log})", file=sys.stderr, flush=True)
        started = time.monotonic()
        with log.open("a") as out:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            rc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=directory).returncode
            out.write(f"# exit {rc} after {time.monotonic() - started:.0f}s\n")
        if rc != 0:
            tail = "\n".join(log.read_text().splitlines()[-30:])
            raise BinariesUnavailable(f"building {tool.name} {tool.version} failed (log {log}):\n{tail}")
        (staging / tool.name).rename(target)
        if not tool.is_current(target):
            raise BinariesUnavailable(f"{target} was built but does not report {tool.version}")
        return target


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in TOOLS:
        sys.exit(f"usage: python -m tests.go_tools {{{'|'.join(TOOLS)}}}")
    try:
        print(ensure(TOOLS[sys.argv[1]]))
    except BinariesUnavailable as exc:
        sys.exit(str(exc))
