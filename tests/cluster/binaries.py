"""Build the cluster tier's binaries from the Go module proxy, once per machine.

The control plane (etcd, kube-apiserver, kube-controller-manager) and the real node (kubelet,
kube-scheduler, kube-proxy and the CNI plugins bridge, host-local, loopback and portmap). The wrapper modules
under gomod/ pin the versions (go.mod) and their checksums (go.sum). Binaries land in a cache
directory keyed by the versions and a hash of the wrapper modules, so a warm machine reuses them and
a change of pin builds into a new directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

K8S_VERSION = "1.35.4"
ETCD_VERSION = "3.6.16"
CNI_PLUGINS_VERSION = "1.9.1"
GOMOD_DIR = Path(__file__).resolve().parent / "gomod"

_STAMP = "k8s.io/component-base/version"
_K8S_LDFLAGS = (
    f"-X {_STAMP}.gitVersion=v{K8S_VERSION} -X {_STAMP}.gitMajor={K8S_VERSION.split('.')[0]} "
    f"-X {_STAMP}.gitMinor={K8S_VERSION.split('.')[1]} -X {_STAMP}.gitTreeState=clean"
)


class BinariesUnavailable(RuntimeError):
    """The binaries are neither cached nor buildable here; the message says why."""


@dataclass(frozen=True)
class Binary:
    name: str  # path under the binaries' directory
    module_dir: str  # wrapper module under gomod/
    package: str
    version_line: str  # a line `NAME --version` prints (stdout or stderr) when the build is the pinned one
    ldflags: str = ""


def _kubernetes(name: str) -> Binary:
    return Binary(name, "apiserver", f"k8s.io/kubernetes/cmd/{name}", f"Kubernetes v{K8S_VERSION}", _K8S_LDFLAGS)


def _cni_plugin(kind: str, name: str) -> Binary:
    """A plugin binary in the cni/ directory containerd runs them from. It ignores its arguments and,
    called without CNI_COMMAND, prints `CNI NAME plugin VERSION` (the version stamped here)."""
    return Binary(f"cni/{name}", "cni", f"github.com/containernetworking/plugins/plugins/{kind}/{name}",
                  f"CNI {name} plugin v{CNI_PLUGINS_VERSION}",
                  "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion="
                  f"v{CNI_PLUGINS_VERSION}")


CONTROL_PLANE_BINARIES = (
    Binary("etcd", "etcd", "go.etcd.io/etcd/server/v3", f"etcd Version: {ETCD_VERSION}"),
    _kubernetes("kube-apiserver"),
    _kubernetes("kube-controller-manager"),
)
NODE_BINARIES = (
    _kubernetes("kube-scheduler"),
    _kubernetes("kubelet"),
    _kubernetes("kube-proxy"),
    *(_cni_plugin(kind, name) for kind, name in
      (("main", "bridge"), ("ipam", "host-local"), ("main", "loopback"), ("meta", "portmap"))),
)
BINARIES = CONTROL_PLANE_BINARIES + NODE_BINARIES


def cache_root() -> Path:
    if os.environ.get("QUEUEWORKER_CACHE_DIR"):
        return Path(os.environ["QUEUEWORKER_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "queueworker"


def bin_dir() -> Path:
    digest = hashlib.sha256()
    for module in sorted({b.module_dir for b in BINARIES}):
        for name in ("go.mod", "go.sum"):
            digest.update((GOMOD_DIR / module / name).read_bytes())
    return cache_root() / "bin" / (f"k8s-v{K8S_VERSION}-etcd-v{ETCD_VERSION}-cni-v{CNI_PLUGINS_VERSION}-"
                                   f"{digest.hexdigest()[:10]}")


def _is_current(path: Path, binary: Binary) -> bool:
    if not os.access(path, os.X_OK):
        return False
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return binary.version_line in (done.stdout + done.stderr).splitlines()


def _go_env() -> dict[str, str]:
    """Everything the build depends on is set here, not inherited from hand-made Go config."""
    env = dict(os.environ)
    env.update(
        CGO_ENABLED="0",
        GOFLAGS="-trimpath -mod=readonly -buildvcs=false",
        GOTOOLCHAIN="local",
        GOWORK="off",
    )
    return env


def _build(go: str, binary: Binary, target: Path, log: Path) -> None:
    partial = target.with_name(f".{target.name}.partial")
    parallelism = str(min(os.cpu_count() or 2, 4))
    cmd = [go, "build", "-p", parallelism, "-o", str(partial), "-ldflags", f"-s -w {binary.ldflags}".strip(),
           binary.package]
    started = time.monotonic()
    with log.open("a") as out:
        out.write(f"$ (cd {GOMOD_DIR / binary.module_dir} && {' '.join(cmd)})\n")
        out.flush()
        rc = subprocess.run(cmd, cwd=GOMOD_DIR / binary.module_dir, env=_go_env(),
                            stdout=out, stderr=subprocess.STDOUT).returncode
        out.write(f"# exit {rc} after {time.monotonic() - started:.0f}s\n")
    if rc != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise BinariesUnavailable(f"building {binary.name} failed (log {log}):\n{tail}")
    partial.rename(target)
    if not _is_current(target, binary):
        raise BinariesUnavailable(f"{target} was built but `--version` does not print {binary.version_line!r}")


def ensure_binaries(binaries: tuple[Binary, ...] = CONTROL_PLANE_BINARIES, build: bool = True) -> Path:
    """Return the binaries' directory, building any of `binaries` that are missing or stale.

    The control plane's by default: the node's take minutes more to build cold and only node mode
    needs them. Concurrent callers (two pytest sessions, CI and a developer) serialize on a lock file.
    """
    directory = bin_dir()
    (directory / "cni").mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = [binary for binary in binaries if not _is_current(directory / binary.name, binary)]
        if missing and not build:
            raise BinariesUnavailable(f"{directory / missing[0].name} is missing; build it with "
                                      "`python -m tests.cluster build`")
        log = directory / "build.log"
        go = shutil.which("go")
        if missing and go is None:
            raise BinariesUnavailable("`go` is not on PATH, so the cluster tier's binaries cannot be built")
        if missing:
            _announce(go, missing, directory, log)
        for number, binary in enumerate(missing, 1):
            started = time.monotonic()
            print(f"  [{number}/{len(missing)}] {binary.name} ({binary.package}) ...", end=" ", file=sys.stderr,
                  flush=True)
            _build(go, binary, directory / binary.name, log)
            print(f"built in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return directory


def _announce(go: str, missing: list[Binary], directory: Path, log: Path) -> None:
    """Says, before a build that prints nothing for minutes, what it builds, where its output and log
    go, and what a cold build costs (measured on the 2-core CI machine type)."""
    found = subprocess.run([go, "env", "GOMODCACHE", "GOCACHE"], capture_output=True, text=True,
                           env=_go_env(), timeout=60).stdout.split()
    caches = f" (Go's module and build caches: {', '.join(found)})" if len(found) == 2 else ""
    print(f"building {len(missing)} test cluster binaries (Kubernetes {K8S_VERSION}, etcd {ETCD_VERSION}, "
          f"CNI plugins {CNI_PLUGINS_VERSION}) from the Go module proxy into {directory}.\n"
          f"A cold build takes about 5-25 minutes on 2 cores and about 5 GB of disk{caches}; "
          f"later runs reuse it. Build log: {log}", file=sys.stderr, flush=True)
