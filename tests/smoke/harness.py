"""The smoke tier's cluster, behind one small seam, and the helpers the smoke tests use on it: psql
inside the demo Postgres pod, Jobs in the worker image, QueueWorkers.

Two providers give the same thing, a cluster with both images loaded and the chart installed with
its demo Postgres:
- `kind`: a kind cluster in Docker; the images are built on the Dockerfiles' default base (pulled
  from Docker Hub), the demo Postgres is the official `postgres` image, pulled by the node.
- `node`: the test cluster's real node with service networking (tests/cluster, as root), for
  machines where kind cannot run (no privileged containers, no registry). The images are built on the
  local Debian base (tests/containers), and the demo Postgres is a stand-in built from Debian's
  PostgreSQL that honours the official image's environment contract (demo_postgres/Dockerfile).

QUEUEWORKER_SMOKE_PROVIDER chooses; by default `node` as root on Linux, else `kind`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.stream import stream

from tests.cluster.controlplane import ControlPlane
from tests.controller_cluster import BUILTIN_TASKS
from tests.containers.engine import Engine
from tests.containers.images import ensure_images

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "queueworker"
DEMO_POSTGRES_CONTEXT = Path(__file__).resolve().parent / "demo_postgres"
RELEASE = "queueworker"  # the chart's fullname is then just "queueworker"
NAMESPACE = "queueworker-smoke"
TAG = "smoke"
WORKER_IMAGE = f"queueworker:{TAG}"
CONTROLLER_IMAGE = f"queueworker-controller:{TAG}"
DEMO_POSTGRES_STAND_IN = f"queueworker-demo-postgres:{TAG}"
DEMO_POSTGRES = f"{RELEASE}-demo-postgres"
PROVIDER_ENV = "QUEUEWORKER_SMOKE_PROVIDER"
PROVIDERS = ("kind", "node")
T = TypeVar("T")


class SmokeUnavailable(Exception):
    """The chosen provider cannot run here: the message says why."""


def chosen_provider() -> str:
    provider = os.environ.get(PROVIDER_ENV) or (
        "node" if sys.platform == "linux" and os.geteuid() == 0 else "kind")
    if provider not in PROVIDERS:
        raise SmokeUnavailable(f"{PROVIDER_ENV}={provider!r}: expected one of {', '.join(PROVIDERS)}")
    return provider


def require_docker() -> str:
    docker = shutil.which("docker")
    if docker is None:
        raise SmokeUnavailable("no `docker` CLI on PATH")
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        lines = (info.stderr or info.stdout).strip().splitlines()
        raise SmokeUnavailable(f"`docker info` failed (no running container engine): {lines[-1] if lines else ''}")
    return docker


# How kind names its default node image inside its binary: `kindest/node:vX.Y.Z@sha256:<digest>`.
KIND_NODE_IMAGE_PATTERN = re.compile(rb"kindest/node:v[0-9][0-9.]*@sha256:[0-9a-f]{64}")
KIND_NODE_IMAGE_ENV = "QUEUEWORKER_KIND_NODE_IMAGE"


def kind_node_image(kind: Path) -> str:
    """The node image `kind create cluster` would run: $QUEUEWORKER_KIND_NODE_IMAGE, else the default
    compiled into the kind binary (kind has no command that prints it)."""
    if os.environ.get(KIND_NODE_IMAGE_ENV):
        return os.environ[KIND_NODE_IMAGE_ENV]
    found = KIND_NODE_IMAGE_PATTERN.search(Path(kind).read_bytes())
    if found is None:
        raise SmokeUnavailable(f"cannot find kind's default node image in {kind}: set {KIND_NODE_IMAGE_ENV}")
    return found.group().decode()


def require_node_image(docker: str, image: str) -> None:
    """Checks, before any cluster is created, that the engine has kind's node image or can pull it, so
    a machine with Docker but no registry skips the tier with the reason instead of failing in
    `kind create cluster`."""
    if subprocess.run([docker, "image", "inspect", image], capture_output=True, timeout=60).returncode == 0:
        return
    pull = subprocess.run([docker, "pull", image], capture_output=True, text=True, timeout=900)
    if pull.returncode != 0:
        lines = (pull.stderr or pull.stdout).strip().splitlines()
        raise SmokeUnavailable(f"kind's node image {image} is not present and cannot be pulled: "
                               f"{lines[-1] if lines else f'`docker pull` exited {pull.returncode}'}")


def run(*cmd: str | Path, timeout: float = 900, **kwargs: Any) -> subprocess.CompletedProcess:
    """Runs a command; a failure raises with its output, so the test report says what broke."""
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
    if result.returncode != 0:
        raise AssertionError(f"`{' '.join(map(str, cmd))}` exited {result.returncode}:\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def wait_for(condition: Callable[[], T], timeout: float, message: str, interval: float = 2.0) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {message} (last value {last!r})")


@dataclass
class SmokeCluster(ABC):
    """A cluster the chart is installed into: made, given the images, torn down by its provider."""

    helm: Path
    kubeconfig: Path

    @abstractmethod
    def create(self) -> None:
        """Start (or find) the cluster and write its kubeconfig."""

    @abstractmethod
    def load_images(self) -> None:
        """Build WORKER_IMAGE and CONTROLLER_IMAGE (and whatever else the install needs) into the cluster."""

    @abstractmethod
    def delete(self) -> None:
        """Tear down what `create` made."""

    def chart_values(self) -> dict[str, str]:
        """`--set` values of this provider on top of the shared ones."""
        return {}

    def helm_cmd(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return run(self.helm, *args, "--kubeconfig", self.kubeconfig, "--namespace", NAMESPACE, timeout=timeout)

    def install(self) -> None:
        values = {"image.repository": "queueworker-controller", "image.tag": TAG, "image.pullPolicy": "Never",
                  "demoPostgres.enabled": "true", **self.chart_values()}
        self.helm_cmd("upgrade", "--install", RELEASE, str(CHART), "--create-namespace", "--wait",
                      "--timeout", "5m", *(arg for key, value in values.items() for arg in ("--set", f"{key}={value}")))

    def api(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.kubeconfig))


@dataclass
class KindCluster(SmokeCluster):
    """A kind cluster, created (or reused by name, and then kept)."""

    kind: Path = Path("kind")
    docker: str = "docker"
    name: str = ""
    reuse: bool = False

    def create(self) -> None:
        existing = run(self.kind, "get", "clusters").stdout.split()
        if self.name not in existing:
            image = kind_node_image(self.kind)
            require_node_image(self.docker, image)
            run(self.kind, "create", "cluster", "--name", self.name, "--image", image,
                "--kubeconfig", self.kubeconfig, "--wait", "180s", timeout=600)
        self.kubeconfig.write_text(run(self.kind, "get", "kubeconfig", "--name", self.name).stdout)

    def delete(self) -> None:
        if not self.reuse:
            run(self.kind, "delete", "cluster", "--name", self.name, "--kubeconfig", self.kubeconfig, timeout=300)

    def load_images(self) -> None:
        for dockerfile, image in (("Dockerfile.worker", WORKER_IMAGE), ("Dockerfile.controller", CONTROLLER_IMAGE)):
            run(self.docker, "build", "--file", ROOT / dockerfile, "--tag", image, ROOT, timeout=1200)
        run(self.kind, "load", "docker-image", WORKER_IMAGE, CONTROLLER_IMAGE, "--name", self.name, timeout=600)


@dataclass
class NodeCluster(SmokeCluster):
    """The test cluster with a real node and service networking, started for the session and stopped
    after it, with nothing left behind."""

    bin_dir: Path = Path()
    state_dir: Path = Path()
    engine: Engine | None = None
    plane: ControlPlane | None = field(default=None, init=False)

    def create(self) -> None:
        self.plane = ControlPlane(self.state_dir, node=True, services=True)
        self.plane.start(self.bin_dir)
        shutil.copyfile(self.plane.kubeconfig, self.kubeconfig)

    def delete(self) -> None:
        if self.plane is not None:
            self.plane.stop()

    def load_images(self) -> None:
        built = ensure_images(self.engine)
        self.engine.run("tag", built.worker, WORKER_IMAGE)
        self.engine.run("tag", built.controller, CONTROLLER_IMAGE)
        self.engine.run("build", "--build-arg", f"BASE_IMAGE={built.base}", "--tag", DEMO_POSTGRES_STAND_IN,
                        str(DEMO_POSTGRES_CONTEXT), timeout=1200)
        for image in (WORKER_IMAGE, CONTROLLER_IMAGE, DEMO_POSTGRES_STAND_IN):
            self.plane.load_image(image)

    def chart_values(self) -> dict[str, str]:
        repository, tag = DEMO_POSTGRES_STAND_IN.split(":")
        return {"demoPostgres.image.repository": repository, "demoPostgres.image.tag": tag,
                "demoPostgres.image.pullPolicy": "Never"}


@dataclass
class Smoke:
    """Helpers bound to the installed release's namespace."""

    cluster: SmokeCluster
    api: client.ApiClient

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def psql(self, statement: str) -> list[list[str]]:
        """Rows of `statement`, run by psql inside the demo Postgres pod (local socket, trust)."""
        (pod,) = self.core.list_namespaced_pod(
            NAMESPACE, label_selector="app.kubernetes.io/component=demo-postgres").items
        ws = stream(self.core.connect_get_namespaced_pod_exec, pod.metadata.name, NAMESPACE,
                    command=["psql", "-U", "queueworker", "-d", "queueworker", "-At", "-F", "\t",
                             "-v", "ON_ERROR_STOP=1", "-c", statement],
                    stdout=True, stderr=True, stdin=False, tty=False, _preload_content=False)
        ws.run_forever(timeout=60)
        out, err = ws.read_stdout() or "", ws.read_stderr() or ""
        if ws.returncode != 0:
            raise AssertionError(f"psql failed ({ws.returncode}): {err}\n{statement}")
        return [line.split("\t") for line in out.splitlines() if line]

    def scalar(self, statement: str) -> int:
        return int(self.psql(statement)[0][0])

    def run_cli(self, *args: str, timeout: float = 180) -> str:
        """`queueworker ARGS` in a Job in the worker image, against the demo Postgres; returns its log."""
        name = f"cli-{uuid.uuid4().hex[:8]}"
        job = {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 3600, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "cli", "image": WORKER_IMAGE, "imagePullPolicy": "Never", "args": list(args),
                    "env": [{"name": "DATABASE_URL",
                             "valueFrom": {"secretKeyRef": {"name": DEMO_POSTGRES, "key": "url"}}}]}]}}}}
        client.BatchV1Api(self.api).create_namespaced_job(NAMESPACE, job)

        def finished() -> str | None:
            status = client.BatchV1Api(self.api).read_namespaced_job_status(name, NAMESPACE).status
            return "ok" if status.succeeded else "failed" if status.failed else None

        outcome = wait_for(finished, timeout, f"Job {name} ({' '.join(args)})")
        (pod,) = self.core.list_namespaced_pod(NAMESPACE, label_selector=f"job-name={name}").items
        log = self.core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE)
        assert outcome == "ok", f"queueworker {' '.join(args)} failed:\n{log}"
        return log

    def enqueue_sleeps(self, queue: str, count: int, seconds: float) -> None:
        self.run_cli("enqueue", "qw.sleep", "--queue", queue, "--count", str(count),
                     "--payload", json.dumps({"seconds": seconds}))

    def apply_queueworker(self, name: str, queue: str, **spec: Any) -> None:
        body = {"apiVersion": "queueworker.dev/v1alpha1", "kind": "QueueWorker",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"queue": queue, "image": WORKER_IMAGE,
                         "database": {"secretRef": {"name": DEMO_POSTGRES}}, "template": BUILTIN_TASKS, **spec}}
        self.custom.create_namespaced_custom_object("queueworker.dev", "v1alpha1", NAMESPACE, "queueworkers", body)

    def delete_queueworker(self, name: str) -> None:
        """Deletes it and waits until the controller has removed its finalizer."""
        self.custom.delete_namespaced_custom_object("queueworker.dev", "v1alpha1", NAMESPACE, "queueworkers", name)

        def gone() -> bool:
            try:
                self.custom.get_namespaced_custom_object("queueworker.dev", "v1alpha1", NAMESPACE,
                                                         "queueworkers", name)
            except client.ApiException as exc:
                return exc.status == 404
            return False

        wait_for(gone, 120, f"QueueWorker {name} to be deleted")

    def worker_replicas(self, queueworker: str) -> int:
        """spec.replicas of the QueueWorker's Deployment, as the controller set it (0 when not there yet)."""
        try:
            return self.apps.read_namespaced_deployment(f"{queueworker}-worker", NAMESPACE).spec.replicas or 0
        except client.ApiException as exc:
            if exc.status == 404:
                return 0
            raise
