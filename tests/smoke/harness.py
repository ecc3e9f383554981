"""A kind cluster with both images loaded and the chart installed, and the helpers the smoke
tests use on it: psql inside the demo Postgres pod, Jobs in the worker image, QueueWorkers."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.stream import stream

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "queueworker"
RELEASE = "queueworker"  # the chart's fullname is then just "queueworker"
NAMESPACE = "queueworker-smoke"
TAG = "smoke"
WORKER_IMAGE = f"queueworker:{TAG}"
CONTROLLER_IMAGE = f"queueworker-controller:{TAG}"
DEMO_POSTGRES = f"{RELEASE}-demo-postgres"
T = TypeVar("T")


class SmokeUnavailable(Exception):
    """No container engine or no kind: the message says which, and the tests skip with it."""


def require_docker() -> str:
    docker = shutil.which("docker")
    if docker is None:
        raise SmokeUnavailable("no `docker` CLI on PATH")
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        lines = (info.stderr or info.stdout).strip().splitlines()
        raise SmokeUnavailable(f"`docker info` failed (no running container engine): {lines[-1] if lines else ''}")
    return docker


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
class KindCluster:
    """One kind cluster: created (or reused by name), images loaded, chart installed."""

    kind: Path
    helm: Path
    docker: str
    name: str
    kubeconfig: Path

    def create(self) -> None:
        existing = run(self.kind, "get", "clusters").stdout.split()
        if self.name not in existing:
            run(self.kind, "create", "cluster", "--name", self.name, "--kubeconfig", self.kubeconfig,
                "--wait", "180s", timeout=600)
        self.kubeconfig.write_text(run(self.kind, "get", "kubeconfig", "--name", self.name).stdout)

    def delete(self) -> None:
        run(self.kind, "delete", "cluster", "--name", self.name, "--kubeconfig", self.kubeconfig, timeout=300)

    def build_and_load_images(self) -> None:
        for dockerfile, image in (("Dockerfile.worker", WORKER_IMAGE), ("Dockerfile.controller", CONTROLLER_IMAGE)):
            run(self.docker, "build", "--file", ROOT / dockerfile, "--tag", image, ROOT, timeout=1200)
        run(self.kind, "load", "docker-image", WORKER_IMAGE, CONTROLLER_IMAGE, "--name", self.name, timeout=600)

    def helm_cmd(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return run(self.helm, *args, "--kubeconfig", self.kubeconfig, "--namespace", NAMESPACE, timeout=timeout)

    def install(self) -> None:
        self.helm_cmd("upgrade", "--install", RELEASE, str(CHART), "--create-namespace", "--wait",
                      "--timeout", "5m", "--set", "image.repository=queueworker-controller",
                      "--set", f"image.tag={TAG}", "--set", "image.pullPolicy=Never",
                      "--set", "demoPostgres.enabled=true")

    def api(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.kubeconfig))


@dataclass
class Smoke:
    """Helpers bound to the installed release's namespace."""

    cluster: KindCluster
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
                         "database": {"secretRef": {"name": DEMO_POSTGRES}}, **spec}}
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
