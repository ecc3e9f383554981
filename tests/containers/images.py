"""The worker and controller images, built from the Dockerfiles by a real engine.

    from tests.containers.images import ensure_images, save
    images = ensure_images()          # Images(base=..., worker=..., controller=...): tags
    save(images.worker, tmp / "worker.tar")   # a `docker save` tarball, e.g. for `ctr images import`

Both build on the local Debian base (base.py) via `--build-arg PYTHON_IMAGE`, so no registry is
needed. Each tag names a hash of the build's inputs (the Dockerfile, every file the build context
lets through .dockerignore, the base tag and this file), so repeated runs reuse the images and a
change to any input builds anew. Old tags stay in the engine: `docker image prune` and `docker rmi`
reclaim them.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.binaries import cache_root

from .base import ensure_base
from .engine import Engine, ensure_engine

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"worker": "Dockerfile.worker", "controller": "Dockerfile.controller"}
REPOSITORIES = {"worker": "queueworker", "controller": "queueworker-controller"}
BUILD_TIMEOUT = 1800

log = logging.getLogger(__name__)


class ImageBuildFailed(RuntimeError):
    """`docker build` failed: a real failure of the Dockerfile or its build (never a skip)."""


@dataclass(frozen=True)
class Images:
    """Tags of the images in the engine: the Python base and the two images built on it."""

    base: str
    worker: str
    controller: str


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex over a slash-separated relative path: `*` and `?` stay
    within a path component, `**` spans any number of them, and a pattern matching a directory
    also matches everything below it (Docker's rules)."""
    parts = []
    for component in pattern.strip("/").split("/"):
        if component == "**":
            parts.append("(?:[^/]+/)*")
        else:
            regex = "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in component)
            parts.append(regex + "/")
    return re.compile("".join(parts).removesuffix("/") + "(?:/.*)?")


def context_files(root: Path = ROOT) -> list[Path]:
    """The files `docker build` sends from `root`, by its .dockerignore (the last matching pattern
    wins; `!` re-includes). Character classes in patterns are not supported."""
    rules = [(line.startswith("!"), _ignore_regex(line.removeprefix("!").strip()))
             for line in (l.strip() for l in (root / ".dockerignore").read_text().splitlines())
             if line and not line.startswith("#")]

    def sent(relative: str) -> bool:
        verdict = True
        for include, regex in rules:
            if regex.fullmatch(relative):
                verdict = include
        return verdict

    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()
                  and sent(p.relative_to(root).as_posix()))


def image_tag(name: str, base: str, root: Path = ROOT) -> str:
    """`REPOSITORY:local-HASH`, HASH over everything the build of `name` depends on."""
    digest = hashlib.sha256(f"{base}\0".encode())
    for path in [Path(__file__), root / DOCKERFILES[name], *context_files(root)]:
        label = path.name if path == Path(__file__) else path.relative_to(root).as_posix()
        digest.update(f"{label}\0{path.stat().st_size}\0".encode() + path.read_bytes())
    return f"{REPOSITORIES[name]}:local-{digest.hexdigest()[:12]}"


def build_log(name: str) -> Path:
    return cache_root() / "images" / f"build-{name}.log"


def _build(engine: Engine, name: str, base: str, tag: str) -> None:
    cmd = ["build", "--file", DOCKERFILES[name], "--build-arg", f"PYTHON_IMAGE={base}", "--force-rm",
           "--tag", tag, "."]
    started = time.monotonic()
    result = engine.run(*cmd, timeout=BUILD_TIMEOUT, cwd=ROOT, check=False)
    elapsed = time.monotonic() - started
    log_path = build_log(name)
    log_path.write_text(f"$ docker {' '.join(cmd)}\n{result.stdout}{result.stderr}# exit {result.returncode} "
                        f"after {elapsed:.0f}s\n")
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-30:])
        raise ImageBuildFailed(f"building {DOCKERFILES[name]} on {base} failed (log {log_path}):\n{tail}")
    log.info("%s image %s built in %.0f s", name, tag, elapsed)


def ensure_images(engine: Engine | None = None) -> Images:
    """The base, worker and controller images, each built only when the engine lacks its tag.

    Starts an engine when none runs (engine.ensure_engine). Raises ContainersUnavailable when no
    engine or base image can be had here, ImageBuildFailed when a Dockerfile does not build.
    A cold run takes minutes (debootstrap, then pip in each build); concurrent callers serialize."""
    engine = engine or ensure_engine()
    base = ensure_base(engine)
    tags = {name: image_tag(name, base) for name in DOCKERFILES}
    lock_path = cache_root() / "images" / ".build.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name, tag in tags.items():
            if engine.run("image", "inspect", tag, check=False).returncode != 0:
                _build(engine, name, base, tag)
    return Images(base, tags["worker"], tags["controller"])


def save(tag: str, path: Path, engine: Engine | None = None) -> Path:
    """Writes `docker save TAG` (a tarball of the image, tag included) to `path`, for another
    runtime: `ctr -n k8s.io images import PATH`, `kind load image-archive PATH`."""
    (engine or ensure_engine()).run("save", "--output", str(path), tag, timeout=600)
    return path
