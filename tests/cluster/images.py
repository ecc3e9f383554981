"""Container images the real node needs, made without a registry (nothing can be pulled here).

- The pause image (every pod's sandbox): `build/pause/linux/pause.c` from the k8s.io/kubernetes
  module source in the Go module cache, compiled with `gcc -static`, as upstream's image does.
- A busybox image for test pods that need a shell, `sleep`, `nc` or signal handling: the static
  `/bin/busybox` of Debian's busybox-static package (fetched with `apt-get download`, not installed)
  with a link per applet.

Each is written once per machine as an image archive in `docker save`'s format, which
`ctr images import` reads like the output of `docker save` (see RealNode.load_image).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import platform
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .binaries import GOMOD_DIR, K8S_VERSION, BinariesUnavailable, cache_root

PAUSE_VERSION = "3.10.1"  # build/pause/Makefile's TAG in k8s.io/kubernetes v1.35.4
PAUSE_IMAGE = f"queueworker.test/pause:{PAUSE_VERSION}"
# Not `latest`: kubelets pull `latest` images on every start, and here nothing can be pulled.
BUSYBOX_IMAGE = "queueworker.test/busybox:static"


@dataclass(frozen=True)
class LayerEntry:
    path: str  # inside the image, without a leading slash
    mode: int
    data: bytes | None = None  # a regular file; None for a directory or a symlink
    link: str | None = None  # a symlink's target


def _architecture() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _layer(entries: list[LayerEntry]) -> bytes:
    """A reproducible tar layer: root-owned, mtime 0, in the given order."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.path)
            info.mode = entry.mode
            if entry.link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, entry.link
                tar.addfile(info)
            elif entry.data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
    return buffer.getvalue()


def write_image_archive(path: Path, name: str, entries: list[LayerEntry], config: dict) -> Path:
    """A one-layer image archive in `docker save`'s format (manifest.json, config, layer) at `path`."""
    layer = _layer(entries)
    layer_digest = hashlib.sha256(layer).hexdigest()
    image_config = json.dumps({
        "architecture": _architecture(), "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        "history": [{"created_by": "tests/cluster/images.py"}],
    }, sort_keys=True).encode()
    config_name = f"{hashlib.sha256(image_config).hexdigest()}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name],
                            "Layers": [f"{layer_digest}/layer.tar"]}]).encode()
    partial = path.with_name(f".{path.name}.partial")
    with tarfile.open(partial, "w") as archive:
        for member, data in ((f"{layer_digest}/layer.tar", layer), (config_name, image_config),
                             ("manifest.json", manifest)):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    partial.rename(path)
    return path


def _images_dir() -> Path:
    directory = cache_root() / "node-images"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _run(cmd: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    except FileNotFoundError as e:
        raise BinariesUnavailable(f"{what}: {e.filename} is not installed") from e
    if done.returncode != 0:
        raise BinariesUnavailable(f"{what} failed ({' '.join(cmd)}):\n{done.stderr.strip() or done.stdout.strip()}")
    return done


def _kubernetes_source() -> Path:
    """The k8s.io/kubernetes module the control plane is built from, as the Go module cache holds it."""
    go = shutil.which("go")
    if go is None:
        raise BinariesUnavailable("`go` is not on PATH, so the pause source cannot be found")
    done = _run([go, "mod", "download", "-json", f"k8s.io/kubernetes@v{K8S_VERSION}"],
                "finding the k8s.io/kubernetes module", cwd=GOMOD_DIR / "apiserver")
    return Path(json.loads(done.stdout)["Dir"])


def pause_archive() -> Path:
    """The pause image archive, compiled and written on first use."""
    path = _images_dir() / f"pause-{PAUSE_VERSION}-k8s-v{K8S_VERSION}.tar"
    with (_images_dir() / ".pause.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return path
        source = _kubernetes_source() / "build" / "pause" / "linux" / "pause.c"
        with tempfile.TemporaryDirectory() as work:
            binary = Path(work) / "pause"
            _run(["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{PAUSE_VERSION}-k8s-v{K8S_VERSION}",
                  "-o", str(binary), str(source)], "compiling pause.c")
            return write_image_archive(path, PAUSE_IMAGE, [LayerEntry("pause", 0o755, binary.read_bytes())],
                                       {"Entrypoint": ["/pause"], "User": "65535:65535"})


def _download_busybox(work: Path) -> Path:
    """The busybox-static .deb, fetched with apt (refreshing the package lists once if it is unknown)."""
    for attempt in range(2):
        done = subprocess.run(["apt-get", "download", "busybox-static"], cwd=work, capture_output=True, text=True)
        if done.returncode == 0:
            return next(work.glob("busybox-static_*.deb"))
        if attempt == 0:
            _run(["apt-get", "update", "-qq"], "refreshing the apt package lists")
    raise BinariesUnavailable(f"apt-get download busybox-static failed:\n{done.stderr.strip()}")


def busybox_archive() -> Path:
    """The busybox image archive, made on first use from Debian's busybox-static."""
    path = _images_dir() / "busybox-static.tar"
    with (_images_dir() / ".busybox.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return path
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            package = _download_busybox(work)
            _run(["dpkg-deb", "-x", str(package), str(work / "root")], f"unpacking {package.name}")
            busybox = work / "root" / "bin" / "busybox"
            applets = _run([str(busybox), "--list-full"], "listing busybox applets").stdout.split()
            entries = [LayerEntry(directory, 0o755) for directory in
                       ("bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "dev", "proc", "sys", "run", "var")]
            entries += [LayerEntry("tmp", 0o1777), LayerEntry("bin/busybox", 0o755, busybox.read_bytes()),
                        LayerEntry("etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/sh\n"
                                                        b"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"),
                        LayerEntry("etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n")]
            entries += [LayerEntry(applet, 0o777, link="/bin/busybox") for applet in applets
                        if applet != "bin/busybox"]
            return write_image_archive(path, BUSYBOX_IMAGE, entries, {
                "Cmd": ["sh"], "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
            })
