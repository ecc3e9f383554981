"""The harness of the controller's cluster tests: its identity (a ServiceAccount bound to exactly the
chart's rules), a namespace with the database Secret and a running `queueworker-controller`
subprocess per test, and the helpers that read what it did (tests/test_controller_cluster.py,
tests/test_controller_cluster_safety.py and the real-node and leader tests use it)."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from queueworker.dev.localpg import free_port
from queueworker.client.producer import enqueue_many
from queueworker_controller.deployment import OWNER_LABEL
from queueworker.scaling.resource import API_VERSION, GROUP, KIND, PLURAL, VERSION

REPO = Path(__file__).resolve().parent.parent
RULES_FILE = REPO / "charts" / "queueworker" / "files" / "controller-rules.yaml"
LEADER_ELECTION_RULES_FILE = REPO / "charts" / "queueworker" / "files" / "leader-election-rules.yaml"
CONTROLLER = Path(sys.executable).parent / "queueworker-controller"
WORKER = Path(sys.executable).parent / "queueworker"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
# Every tick of a QueueWorker that decides counts one here (by reason); one refused before it
# decides (an unusable spec, a Deployment it cannot write), one in ERRORS.
DECISIONS = "queueworker_controller_decisions_total"
ERRORS = "queueworker_controller_errors_total"
SYSTEM_NAMESPACE = "queueworker-system"
ACCOUNT = "queueworker-controller"
DB_SECRET = "app-db"


# --- session setup: the controller's identity ------------------------------------------

def write_controller_kubeconfig(plane, path: Path) -> Path:
    """A kubeconfig for a ServiceAccount bound (ClusterRoleBinding) to a ClusterRole with the chart's rules,
    and (RoleBinding) to a Role with the chart's leader-election rules in its own namespace."""
    rules = yaml.safe_load(RULES_FILE.read_text())
    subjects = [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": SYSTEM_NAMESPACE}]
    with plane.api_client() as api:
        core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
        core.create_namespace({"metadata": {"name": SYSTEM_NAMESPACE}})
        core.create_namespaced_service_account(SYSTEM_NAMESPACE, {"metadata": {"name": ACCOUNT}})
        rbac.create_cluster_role({"metadata": {"name": ACCOUNT}, "rules": rules})
        rbac.create_cluster_role_binding({
            "metadata": {"name": ACCOUNT},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ACCOUNT},
            "subjects": subjects})
        rbac.create_namespaced_role(SYSTEM_NAMESPACE, {
            "metadata": {"name": ACCOUNT}, "rules": yaml.safe_load(LEADER_ELECTION_RULES_FILE.read_text())})
        rbac.create_namespaced_role_binding(SYSTEM_NAMESPACE, {
            "metadata": {"name": ACCOUNT},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACCOUNT},
            "subjects": subjects})
    return write_service_account_kubeconfig(plane, SYSTEM_NAMESPACE, ACCOUNT, path)


def write_service_account_kubeconfig(plane, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig acting as ServiceAccount `namespace/account` (a token valid for 6 hours)."""
    with plane.api_client() as api:
        token = client.CoreV1Api(api).create_namespaced_service_account_token(
            account, namespace, {"spec": {"expirationSeconds": 6 * 3600}}).status.token
    server = yaml.safe_load(plane.kubeconfig.read_text())["clusters"][0]["cluster"]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": account,
        "clusters": [{"name": "test", "cluster": server}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": {"cluster": "test", "user": account}}]}))
    return path


# --- per test: a namespace with the database Secret and a running controller -------------------------


def create_queueworker(api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any],
                       **options: Any) -> dict[str, Any]:
    """Creates QueueWorker `name` with `spec`, its fields validated strictly (an unknown field is
    refused, as `kubectl apply` refuses it); `options` go to the API call (dry_run="All", ...)."""
    return client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name},
                                            "spec": spec}, field_validation="Strict", **options)

@dataclass
class Cluster:
    """Helpers bound to one test namespace, acting as the admin."""

    plane: Any
    namespace: str
    api: client.ApiClient
    controller_log: Path
    metrics_port: int
    liveness_port: int

    def metrics(self) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()

    def ticks(self, name: str, counter: str = DECISIONS) -> float:
        """The ticks of QueueWorker `name` that `counter` (DECISIONS or ERRORS) has counted so far."""
        return sum(sample.value for family in text_string_to_metric_families(self.metrics())
                   for sample in family.samples
                   if sample.name == counter and sample.labels.get("namespace") == self.namespace
                   and sample.labels.get("name") == name)

    def wait_for_ticks(self, count: int, *names: str, counter: str = DECISIONS) -> None:
        """Returns once the controller has ticked `count` more times for each QueueWorker of `names`,
        as its metrics count them: what a tick would have changed, it has changed by then."""
        start = {name: self.ticks(name, counter) for name in names}
        self.wait_for(lambda: all(self.ticks(name, counter) >= start[name] + count for name in names),
                      timeout=30 + 5 * count, message=f"{count} more ticks of {', '.join(names)}")

    def forgotten(self, name: str) -> bool:
        """The controller has dropped what it kept for a deleted QueueWorker (its metric series go last)."""
        return f'name="{name}",namespace="{self.namespace}"' not in self.metrics()

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def apply(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return create_queueworker(self.api, self.namespace, name, spec)

    def queueworker(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def delete_queueworkers(self) -> None:
        """Deletes every QueueWorker of the namespace, and waits until a running controller has removed
        kopf's finalizer from each."""
        for item in self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)["items"]:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, item["metadata"]["name"])
        self.wait_for(lambda: not self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL)["items"], timeout=30, message="QueueWorkers deleted")

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        conditions = self.queueworker(name).get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == type_), {})

    def replicas(self, name: str) -> int:
        return self.apps.read_namespaced_deployment(f"{name}-worker", self.namespace).spec.replicas

    def pods(self, name: str) -> list[client.V1Pod]:
        """The worker pods that are not terminating."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{OWNER_LABEL}={name}").items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def events(self, reason: str | None = None) -> list[client.CoreV1Event]:
        return [e for e in self.core.list_namespaced_event(self.namespace).items if reason in (None, e.reason)]

    def secret(self, name: str, value: str | bytes, key: str = "url") -> None:
        """Creates or replaces Secret `name` with `value` under `key` (any bytes)."""
        raw = value if isinstance(value, bytes) else value.encode()
        body = {"metadata": {"name": name}, "data": {key: base64.b64encode(raw).decode()}}
        try:
            self.core.create_namespaced_secret(self.namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.core.replace_namespaced_secret(name, self.namespace, body)

    def enforce_restricted(self) -> None:
        self.core.patch_namespace(self.namespace, {"metadata": {"labels": RESTRICTED}})

    def wait_for(self, condition, timeout: float = 60, message: str | Callable[[], str] = "") -> Any:
        """`plane.wait_for`, with the controller's log (and `message()`, when it is a function,
        computed only on failure) in the error."""
        try:
            return self.plane.wait_for(condition, timeout=timeout, interval=0.1,
                                       message=message if isinstance(message, str) else "")
        except AssertionError as exc:
            detail = "" if isinstance(message, str) else f"\n{message()}"
            raise AssertionError(f"{exc}{detail}\n--- controller log tail ---\n{self.log_tail()}") from None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.controller_log.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def running_controller(plane, namespace: str, kubeconfig: Path, database_url: str, tmp_path: Path,
                       *extra_args: str) -> Iterator[Cluster]:
    """`namespace` with Secret `app-db` (key `url`) holding `database_url`, and the controller, as
    production starts it (plus `extra_args`), watching that namespace; QueueWorkers are deleted while
    it still runs."""
    log_path = tmp_path / "controller.log"
    with plane.api_client() as api:
        helper = Cluster(plane, namespace, api, log_path, free_port(), free_port())
        helper.core.create_namespaced_secret(namespace, {
            "metadata": {"name": DB_SECRET}, "stringData": {"url": database_url}})
        process = start_controller(kubeconfig, namespace, log_path, helper.metrics_port, helper.liveness_port,
                                   *extra_args)
        try:
            yield helper
            helper.delete_queueworkers()
        finally:
            stop_controller(process)
            print(f"--- controller log ({log_path}) ---\n{helper.log_tail(200)}")


def start_controller(kubeconfig: Path, namespace: str, log_path: Path, metrics_port: int, liveness_port: int,
                     *extra_args: str) -> subprocess.Popen:
    """`queueworker-controller` as production starts it, watching `namespace`, logging to `log_path`."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [str(CONTROLLER), "--namespace", namespace, "--metrics-port", str(metrics_port),
             "--metrics-address", "127.0.0.1", f"--liveness=http://127.0.0.1:{liveness_port}/healthz", *extra_args],
            env={**os.environ, "KUBECONFIG": str(kubeconfig)}, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)


def stop_controller(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)  # a test may have frozen it
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture
def cluster(control_plane, cluster_namespace, controller_kubeconfig, dsn, tmp_path) -> Iterator[Cluster]:
    """The namespace with Secret `app-db` (key `url`) and a controller watching it."""
    with running_controller(control_plane, cluster_namespace, controller_kubeconfig, dsn, tmp_path) as helper:
        yield helper


# A pod template whose worker runs the built-in qw.* tasks the tests enqueue (off by default).
BUILTIN_TASKS = {"spec": {"containers": [{"name": "worker", "env": [{"name": "QUEUEWORKER_BUILTIN_TASKS", "value": "true"}]}]}}


def worker_spec(**scaling: Any) -> dict[str, Any]:
    """A QueueWorker spec for tests: short windows, fast leases, no metrics port (pods share 127.0.0.1)."""
    return {"queue": "jobs", "image": "queueworker:test", "database": {"secretRef": {"name": DB_SECRET}},
            "concurrency": 1, "leaseSeconds": 6, "drainSeconds": 1, "metricsPort": 0, "template": BUILTIN_TASKS,
            "scaling": {"pollingIntervalSeconds": 1, "scaleDownStabilizationSeconds": 2, "cooldownSeconds": 2,
                        **scaling}}


def enqueue_sleeps(dsn: str, *seconds: float, queue: str = "jobs") -> list[int]:
    with psycopg.connect(dsn) as conn:
        return enqueue_many(conn, [{"task": "qw.sleep", "payload": {"seconds": s}, "queue": queue} for s in seconds])


def announce(dsn: str, queue: str) -> None:
    """What a producer sends after an enqueue, here with no task behind it: the QueueWorkers of the
    queue look at it now rather than at their next poll."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_notify('queueworker', %s)", (queue,))


def task_report(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        states = dict(conn.execute("SELECT state::text, count(*) FROM queueworker.tasks GROUP BY 1").fetchall())
        succeeded_twice = conn.execute(
            "SELECT count(*) FROM (SELECT task_id FROM queueworker.task_events WHERE to_state = 'succeeded' "
            "GROUP BY task_id HAVING count(*) > 1) d").fetchone()[0]
    return {"states": states, "succeeded_more_than_once": succeeded_twice}


def lease_holders(dsn: str) -> dict[int, str]:
    """Running task id -> the pod whose worker holds its lease."""
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute(
            "SELECT t.id, w.pod_name FROM queueworker.tasks t JOIN queueworker.workers w ON w.id = t.lease_owner "
            "WHERE t.state = 'running'").fetchall())


