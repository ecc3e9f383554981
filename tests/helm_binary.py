"""Build helm from the Go module proxy, once per machine, like the test control plane binaries.

The binary lands in a cache directory keyed by helm's version and the Kubernetes version it is
stamped with. Without the Makefile's ldflags a `go install`ed helm reports `v3.21` and defaults
`.Capabilities.KubeVersion` to v1.20.0, so the stamps below matter (shared notes, control-plane §10).

    python -m tests.helm_binary      # builds if needed, prints the path
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster.binaries import K8S_VERSION, BinariesUnavailable, cache_root

HELM_VERSION = "v3.21.4"
HELM_MODULE = "helm.sh/helm/v3"
_K8S_MAJOR, _K8S_MINOR = K8S_VERSION.split(".")[:2]
LDFLAGS = " ".join([
    "-s -w",
    f"-X {HELM_MODULE}/internal/version.version={HELM_VERSION}",
    "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
    *(f"-X {HELM_MODULE}/pkg/{pkg}.k8sVersion{part}={value}"
      for pkg in ("chartutil", "lint/rules")
      for part, value in (("Major", _K8S_MAJOR), ("Minor", _K8S_MINOR))),
])


def helm_dir() -> Path:
    return cache_root() / "bin" / f"helm-{HELM_VERSION}-k8s-v{K8S_VERSION}"


def _is_current(path: Path) -> bool:
    if not os.access(path, os.X_OK):
        return False
    try:
        out = subprocess.run([path, "version", "--template", "{{.Version}}"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.strip() == HELM_VERSION


def ensure_helm() -> Path:
    """The path of a helm binary of the pinned version, built with `go install` if missing.

    Raises BinariesUnavailable (with the build log's tail) when Go or the module proxy is missing.
    Concurrent callers serialize on a lock file.
    """
    directory = helm_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "helm"
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_current(target):
            return target
        go = shutil.which("go") or next((p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go")
                                         if os.access(p, os.X_OK)), None)
        if go is None:
            raise BinariesUnavailable("`go` is not on PATH, so helm cannot be built")
        staging = directory / ".gobin"
        env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOWORK": "off", "GOFLAGS": "-trimpath",
               "GOBIN": str(staging)}
        cmd = [go, "install", "-ldflags", LDFLAGS, f"{HELM_MODULE}/cmd/helm@{HELM_VERSION}"]
        log = directory / "build.log"
        started = time.monotonic()
        with log.open("a") as out:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            rc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=directory).returncode
            out.write(f"# exit {rc} after {time.monotonic() - started:.0f}s\n")
        if rc != 0:
            tail = "\n".join(log.read_text().splitlines()[-30:])
            raise BinariesUnavailable(f"building helm {HELM_VERSION} failed (log {log}):\n{tail}")
        (staging / "helm").rename(target)
        if not _is_current(target):
            raise BinariesUnavailable(f"{target} was built but does not report {HELM_VERSION}")
        return target


if __name__ == "__main__":
    try:
        print(ensure_helm())
    except BinariesUnavailable as exc:
        sys.exit(str(exc))
