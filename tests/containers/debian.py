"""Debian packages for the machine the tests run on, and the mirror its apt uses.

The image tier needs programs no Python wheel provides (dockerd, debootstrap); on a Debian
machine, as root, it installs them with apt, so a fresh CI machine needs no preparation.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from . import ContainersUnavailable

APT_SOURCES = Path("/etc/apt/sources.list")
APT_SOURCES_DIR = Path("/etc/apt/sources.list.d")
_APT_ENV = {"DEBIAN_FRONTEND": "noninteractive", "NEEDRESTART_MODE": "a"}
# Wait for another apt or dpkg (a parallel session, unattended upgrades) instead of failing at once.
_APT_OPTIONS = ["-o", "DPkg::Lock::Timeout=600", "-o", "APT::Get::Assume-Yes=true", "-qq"]


def installed(package: str) -> bool:
    result = subprocess.run(["dpkg-query", "--show", "--showformat=${Status}", package],
                            capture_output=True, text=True)
    return result.returncode == 0 and result.stdout.strip() == "install ok installed"


def ensure_packages(*packages: str) -> None:
    """Installs whichever of `packages` are missing (without recommends), updating the package
    lists only when an install from the present ones fails. Raises ContainersUnavailable where
    apt cannot be used: not Debian, not root, or apt refuses."""
    if shutil.which("dpkg-query") is None or shutil.which("apt-get") is None:
        raise ContainersUnavailable(f"{', '.join(packages)} needed, and this machine has no apt to install them")
    missing = [p for p in packages if not installed(p)]
    if not missing:
        return
    if os.geteuid() != 0:
        raise ContainersUnavailable(f"{', '.join(missing)} not installed, and installing them needs root")
    install = ["apt-get", *_APT_OPTIONS, "install", "--no-install-recommends", *missing]
    env = {**os.environ, **_APT_ENV}
    result = subprocess.run(install, capture_output=True, text=True, env=env, timeout=1200)
    if result.returncode != 0:  # stale or absent package lists: update them once, then retry
        update = subprocess.run(["apt-get", *_APT_OPTIONS, "update"], capture_output=True, text=True,
                                env=env, timeout=600)
        result = update if update.returncode != 0 else subprocess.run(
            install, capture_output=True, text=True, env=env, timeout=1200)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise ContainersUnavailable(f"`{' '.join(result.args)}` failed:\n{tail}")


def mirror(suite: str) -> str:
    """The URI of the first apt source that serves `suite` (both the one-line and the deb822
    formats), so debootstrap fetches from where this machine's apt does (a proxy, a snapshot)."""
    for path in [APT_SOURCES, *sorted(APT_SOURCES_DIR.glob("*.list"))]:
        if path.is_file():
            for line in path.read_text().splitlines():
                fields = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()  # drop [options]
                if len(fields) >= 3 and fields[0] == "deb" and fields[2] == suite:
                    return fields[1]
    for path in sorted(APT_SOURCES_DIR.glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            fields = dict(re.findall(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, flags=re.MULTILINE))
            if ("deb" in fields.get("Types", "").split() and suite in fields.get("Suites", "").split()
                    and fields.get("Enabled", "yes") != "no" and fields.get("URIs")):
                return fields["URIs"].split()[0]
    raise ContainersUnavailable(f"no apt source of this machine serves Debian {suite}")
