"""A Python base image made from Debian packages, for machines that cannot pull `python:*`.

The Dockerfiles build `FROM ${PYTHON_IMAGE}` (default `python:3.11-slim-bookworm`). Without a
registry, this module makes a stand-in: `debootstrap --variant=minbase` of Debian bookworm with
Python 3.11, venv, pip and tini, slimmed the way the official `debian:*-slim` images are (an apt
hook that drops its caches, no translations, dpkg path-excludes for docs, man pages and locales),
trusting the CA certificates this machine added locally (pip in the builds goes through the same
TLS middleboxes as the host), and `docker import`ed.

The tag names a hash of what goes in: this file (package list, settings) and the local CA
certificates, so a change rebuilds and an unchanged machine reuses the image. The root
filesystem's tarball is kept in the cache, so an engine with an empty data root re-imports it in
seconds instead of running debootstrap again (most of a cold build).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.cluster.binaries import cache_root

from . import ContainersUnavailable
from .debian import ensure_packages, mirror
from .engine import Engine

SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates", "tini")
REPOSITORY = "queueworker-python"
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")  # update-ca-certificates' input, *.crt in any subdir
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
IMPORT_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
)

# Files the official slim images leave out (debuerreotype's slimify lists), and the exceptions they keep.
SLIM_EXCLUDES = ("/usr/share/doc/*", "/usr/share/info/*", "/usr/share/linda/*", "/usr/share/lintian/overrides/*",
                 "/usr/share/locale/*", "/usr/share/man/*")
SLIM_INCLUDES = ("/usr/share/doc/*/copyright", "/usr/share/locale/locale.alias")
APT_CLEAN = '"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true";'
CONFIG_FILES = {
    # Every `apt-get install` in a build would otherwise leave ~80 MB of caches in its layer.
    "etc/apt/apt.conf.d/docker-clean": f"DPkg::Post-Invoke {{ {APT_CLEAN} }};\n"
                                       f"APT::Update::Post-Invoke {{ {APT_CLEAN} }};\n"
                                       'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n',
    "etc/apt/apt.conf.d/docker-no-languages": 'Acquire::Languages "none";\n',
    "etc/apt/apt.conf.d/docker-gzip-indexes": 'Acquire::GzipIndexes "true";\n',
    "etc/apt/apt.conf.d/docker-autoremove-suggests": 'Apt::AutoRemove::SuggestsImportant "false";\n',
    "etc/dpkg/dpkg.cfg.d/docker-apt-speedup": "force-unsafe-io\n",
    "etc/dpkg/dpkg.cfg.d/docker": "".join(f"path-exclude {p}\n" for p in SLIM_EXCLUDES)
                                  + "".join(f"path-include {p}\n" for p in SLIM_INCLUDES),
    "usr/sbin/policy-rc.d": "#!/bin/sh\n# Packages installed in image builds must not start services.\nexit 101\n",
    # pip verifies against the system bundle, which holds this machine's local CAs too.
    "etc/pip.conf": f"[global]\ncert = {CA_BUNDLE}\n",
}

log = logging.getLogger(__name__)


def local_ca_certificates() -> list[Path]:
    return sorted(LOCAL_CA_DIR.rglob("*.crt")) if LOCAL_CA_DIR.is_dir() else []


def base_tag() -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for cert in local_ca_certificates():
        digest.update(str(cert.relative_to(LOCAL_CA_DIR)).encode() + b"\0" + cert.read_bytes())
    return f"{REPOSITORY}:3.11-slim-{SUITE}-{digest.hexdigest()[:12]}"


def rootfs_tarball(tag: str) -> Path:
    return cache_root() / "images" / f"{tag.replace(':', '-')}.rootfs.tar"


def ensure_base(engine: Engine) -> str:
    """The base image's tag, imported from the cached tarball or built with debootstrap when the
    engine does not have it. Raises ContainersUnavailable when debootstrap cannot run here."""
    tag = base_tag()
    tarball = rootfs_tarball(tag)
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with (tarball.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if engine.run("image", "inspect", tag, check=False).returncode == 0:
            return tag
        if not tarball.exists():
            started = time.monotonic()
            _build_rootfs_tarball(tarball)
            log.info("base root filesystem built with debootstrap in %.0f s: %s", time.monotonic() - started, tarball)
        started = time.monotonic()
        engine.run("import", *(arg for change in IMPORT_CHANGES for arg in ("--change", change)),
                   str(tarball), tag, timeout=600)
        log.info("base image %s imported in %.0f s", tag, time.monotonic() - started)
    return tag


def _build_rootfs_tarball(tarball: Path) -> None:
    """debootstrap into a work directory beside the tarball (a killed run's leftovers, mounts
    included, are cleared first), then the tarball; tarballs of earlier inputs are removed."""
    ensure_packages("debootstrap")
    root = tarball.parent / ".rootfs"
    _remove_rootfs(root)
    try:
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(root),
              mirror(SUITE)], "debootstrap", timeout=1800)
        _slim(root)
        _trust_local_cas(root)
        partial = tarball.with_name(tarball.name + ".partial")
        _run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], "tar", timeout=600)
        partial.rename(tarball)
    finally:
        _remove_rootfs(root)
    for stale in tarball.parent.glob(f"{REPOSITORY}-*.rootfs.tar"):
        if stale != tarball:
            stale.unlink()


def _slim(root: Path) -> None:
    """The slim images' settings (CONFIG_FILES), then what they would have kept out removed now,
    since debootstrap unpacked the packages before the settings existed; caches and lists emptied."""
    for relative, text in CONFIG_FILES.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755 if relative.startswith("usr/sbin/") else 0o644)
    kept = [str(root / p.lstrip("/")) for p in SLIM_INCLUDES]
    directories = [root / p.lstrip("/").removesuffix("/*") for p in SLIM_EXCLUDES]
    directories = [d for d in directories if d.is_dir()]
    for directory in directories:
        for path in directory.rglob("*"):
            if not path.is_symlink() and path.is_file() and not any(path.match(k) for k in kept):
                path.unlink()
    removed = True
    while removed:  # a dangling link may leave its directory empty, and an emptied directory a link dangling
        removed = False
        for directory in directories:
            for path in sorted(directory.rglob("*"), reverse=True):  # children before their directories
                if path.is_symlink() and not _resolves_inside(root, path):
                    path.unlink()
                    removed = True
                elif path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
                    path.rmdir()
                    removed = True
    for pattern in ("var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb", "var/log/*.log"):
        for path in root.glob(pattern):
            if path.is_file():
                path.unlink()


def _resolves_inside(root: Path, link: Path) -> bool:
    """Whether `link` ends at something, following it (and alternatives' links) inside `root`:
    an absolute target means a path of the root, never one of the host."""
    path = link
    for _ in range(40):  # the kernel's own limit on a chain of links
        if not path.is_symlink():
            return path.exists()
        target = Path(os.readlink(path))
        path = root / target.relative_to("/") if target.is_absolute() else path.parent / target
    return False


def _trust_local_cas(root: Path) -> None:
    """This machine's locally added CAs into the root's bundle (update-ca-certificates in a chroot)."""
    certs = local_ca_certificates()
    if not certs:
        return
    target = root / LOCAL_CA_DIR.relative_to("/")
    for cert in certs:
        destination = target / cert.relative_to(LOCAL_CA_DIR)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cert, destination)
    proc = root / "proc"
    _run(["mount", "-t", "proc", "proc", str(proc)], "mount proc")
    try:
        _run(["chroot", str(root), "update-ca-certificates"], "update-ca-certificates")
    finally:
        _run(["umount", str(proc)], "umount proc")


def _remove_rootfs(root: Path) -> None:
    """Removes a root filesystem, unmounting first whatever debootstrap or a chroot left mounted
    below it (deepest first), so the removal cannot reach into the host's /proc or /sys."""
    prefix = str(root.resolve()) + "/"
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount_point in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", mount_point], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


def _run(cmd: list[str], what: str, timeout: float = 120) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-20:])
        raise ContainersUnavailable(f"building the base image: {what} failed (exit {result.returncode}):\n{tail}")

