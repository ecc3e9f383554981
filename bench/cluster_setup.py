"""What the controller benchmarks share: a local Postgres, the test control plane (tests/cluster, with
the process kubelet or a real node) with the QueueWorker CRD, a namespace holding the database Secret
`db`, and `queueworker-controller` run as a subprocess, as in production. Everything started here is
stopped on the way out, also when the benchmark fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from queueworker.dev.localpg import LocalPostgres
from queueworker.db.migrate import migrate
from queueworker_controller.spec import GROUP, KIND, PLURAL, VERSION
from tests.cluster.binaries import BINARIES, CONTROL_PLANE_BINARIES, ensure_binaries
from tests.cluster.controlplane import ControlPlane
from tests.cluster.fixtures import postgres_for_pods

REPO = Path(__file__).resolve().parent.parent
CONTROLLER = Path(sys.executable).parent / "queueworker-controller"
CONTROLLER_STOP_SECONDS = 20


@dataclass
class BenchCluster:
    server: LocalPostgres
    plane: ControlPlane
    namespace: str
    core: client.CoreV1Api
    apps: client.AppsV1Api
    custom: client.CustomObjectsApi

    def create_queueworker(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": name}, "spec": spec})

    def queueworkers(self) -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)["items"]

    def create_secret(self, name: str, dsn: str) -> None:
        self.core.create_namespaced_secret(self.namespace, {"metadata": {"name": name}, "stringData": {"url": dsn}})


@contextmanager
def bench_cluster(namespace: str, node: bool = False) -> Iterator[BenchCluster]:
    """A migrated Postgres and a control plane serving QueueWorkers, with `namespace` and its Secret `db`.
    With `node`, pods run in containers on a real node (tests/cluster/node.py: root only): Postgres then
    listens on the node's IP too, and the Secret holds the URL by which pods reach it."""
    plane = ControlPlane(Path(tempfile.mkdtemp(prefix="qw-bench-plane-")), node=node)
    with ExitStack() as stack:
        stack.callback(plane.stop)
        plane.start(ensure_binaries(BINARIES if node else CONTROL_PLANE_BINARIES))
        if node:
            postgres = stack.enter_context(postgres_for_pods(plane))
            server, pods_dsn = postgres.server, postgres.pod_dsn
        else:
            server = LocalPostgres()
            server.start()
            stack.callback(server.destroy)
            pods_dsn = server.dsn
        migrate(server.dsn)
        api = plane.api_client()
        client.ApiextensionsV1Api(api).create_custom_resource_definition(
            yaml.safe_load((REPO / "crds" / "queueworker.dev_queueworkers.yaml").read_text()))
        cluster = BenchCluster(server, plane, namespace, client.CoreV1Api(api), client.AppsV1Api(api),
                               client.CustomObjectsApi(api))
        cluster.core.create_namespace({"metadata": {"name": namespace}})
        plane.wait_for(lambda: cluster.core.read_namespaced_service_account("default", namespace))
        cluster.create_secret("db", pods_dsn)
        plane.wait_for(lambda: cluster.queueworkers() is not None, timeout=60, message="the CRD served")
        yield cluster


@contextmanager
def running_controller(cluster: BenchCluster, *extra_args: str) -> Iterator[subprocess.Popen]:
    """`queueworker-controller --namespace NS`, logging to the control plane's log directory."""
    with (cluster.plane.log_dir / "queueworker-controller.log").open("ab") as log:
        controller = subprocess.Popen([str(CONTROLLER), "--namespace", cluster.namespace, *extra_args],
                                      env={**os.environ, "KUBECONFIG": str(cluster.plane.kubeconfig)},
                                      stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        yield controller
    finally:
        controller.send_signal(signal.SIGTERM)
        try:
            controller.wait(timeout=CONTROLLER_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            controller.kill()
            controller.wait()
