"""The controller against a real API server, controller-manager, process kubelet and Postgres.

It runs as in production: the `queueworker-controller` console script in a subprocess, as a
ServiceAccount bound to a ClusterRole made of exactly the rules the chart grants
(charts/queueworker/files/controller-rules.yaml). Worker pods really run `queueworker worker`.
Windows are shortened in the test QueueWorkers so the whole file stays within a few minutes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from queueworker.localpg import free_port
from queueworker.producer import enqueue_many
from queueworker_controller.deployment import OWNER_LABEL
from queueworker_controller.kube import DELETION_COST_ANNOTATION
from queueworker_controller.spec import GROUP, PLURAL, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

REPO = Path(__file__).resolve().parent.parent
CRD_FILE = REPO / "crds" / "queueworker.dev_queueworkers.yaml"
RULES_FILE = REPO / "charts" / "queueworker" / "files" / "controller-rules.yaml"
CONTROLLER = Path(sys.executable).parent / "queueworker-controller"
SYSTEM_NAMESPACE = "queueworker-system"
ACCOUNT = "queueworker-controller"
DB_SECRET = "app-db"


# --- session setup: the CRD and the controller's identity ------------------------------------------

@pytest.fixture(scope="session")
def crd(control_plane) -> None:
    with control_plane.api_client() as api:
        extensions = client.ApiextensionsV1Api(api)
        manifest = yaml.safe_load(CRD_FILE.read_text())
        try:
            extensions.create_custom_resource_definition(manifest)
        except ApiException as exc:
            if exc.status != 409:
                raise
        control_plane.wait_for(lambda: any(
            c.type == "Established" and c.status == "True"
            for c in extensions.read_custom_resource_definition(manifest["metadata"]["name"]).status.conditions or []
        ), timeout=30, message="CRD Established")


@pytest.fixture(scope="session")
def controller_kubeconfig(control_plane, crd, tmp_path_factory) -> Path:
    """A kubeconfig for a ServiceAccount bound (ClusterRoleBinding) to a ClusterRole with the chart's rules."""
    rules = yaml.safe_load(RULES_FILE.read_text())
    with control_plane.api_client() as api:
        core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
        core.create_namespace({"metadata": {"name": SYSTEM_NAMESPACE}})
        core.create_namespaced_service_account(SYSTEM_NAMESPACE, {"metadata": {"name": ACCOUNT}})
        rbac.create_cluster_role({"metadata": {"name": ACCOUNT}, "rules": rules})
        rbac.create_cluster_role_binding({
            "metadata": {"name": ACCOUNT},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ACCOUNT},
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": SYSTEM_NAMESPACE}]})
        token = core.create_namespaced_service_account_token(
            ACCOUNT, SYSTEM_NAMESPACE, {"spec": {"expirationSeconds": 6 * 3600}}).status.token
    admin = yaml.safe_load(control_plane.kubeconfig.read_text())
    server = admin["clusters"][0]["cluster"]
    path = tmp_path_factory.mktemp("controller") / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "controller",
        "clusters": [{"name": "test", "cluster": server}],
        "users": [{"name": ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "controller", "context": {"cluster": "test", "user": ACCOUNT}}]}))
    return path


# --- per test: a namespace with the database Secret and a running controller -------------------------

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
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "QueueWorker", "metadata": {"name": name}, "spec": spec},
            field_validation="Strict")

    def queueworker(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        conditions = self.queueworker(name).get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == type_), {})

    def replicas(self, name: str) -> int:
        return self.apps.read_namespaced_deployment(f"{name}-worker", self.namespace).spec.replicas

    def pods(self, name: str) -> list[client.V1Pod]:
        """The worker pods that are not terminating."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{OWNER_LABEL}={name}").items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def events(self, reason: str) -> list[client.CoreV1Event]:
        return [e for e in self.core.list_namespaced_event(self.namespace).items if e.reason == reason]

    def wait_for(self, condition, timeout: float = 60, message: str = "") -> Any:
        try:
            return self.plane.wait_for(condition, timeout=timeout, interval=0.1, message=message)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- controller log tail ---\n{self.log_tail()}") from None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.controller_log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
def cluster(control_plane, cluster_namespace, controller_kubeconfig, dsn, tmp_path) -> Iterator[Cluster]:
    """The namespace with Secret `app-db` (key `url`) and a controller watching it."""
    log_path = tmp_path / "controller.log"
    with control_plane.api_client() as api:
        helper = Cluster(control_plane, cluster_namespace, api, log_path, free_port(), free_port())
        helper.core.create_namespaced_secret(cluster_namespace, {
            "metadata": {"name": DB_SECRET}, "stringData": {"url": dsn}})
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(CONTROLLER), "--namespace", cluster_namespace, "--metrics-port", str(helper.metrics_port),
                 f"--liveness=http://127.0.0.1:{helper.liveness_port}/healthz"],
                env={**os.environ, "KUBECONFIG": str(controller_kubeconfig)}, stdout=log, stderr=subprocess.STDOUT,
                cwd=REPO)
        try:
            yield helper
            # Delete while the controller still runs, so kopf's finalizer is removed.
            for item in helper.custom.list_namespaced_custom_object(GROUP, VERSION, cluster_namespace, PLURAL)["items"]:
                helper.custom.delete_namespaced_custom_object(GROUP, VERSION, cluster_namespace, PLURAL,
                                                              item["metadata"]["name"])
            helper.wait_for(lambda: not helper.custom.list_namespaced_custom_object(
                GROUP, VERSION, cluster_namespace, PLURAL)["items"], timeout=30, message="QueueWorkers deleted")
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            print(f"--- controller log ({log_path}) ---\n{helper.log_tail(200)}")


def worker_spec(**scaling: Any) -> dict[str, Any]:
    """A QueueWorker spec for tests: short windows, fast leases, no metrics port (pods share 127.0.0.1)."""
    return {"queue": "jobs", "image": "queueworker:test", "database": {"secretRef": {"name": DB_SECRET}},
            "concurrency": 1, "leaseSeconds": 6, "drainSeconds": 1, "metricsPort": 0,
            "scaling": {"pollingIntervalSeconds": 1, "scaleDownStabilizationSeconds": 2, "cooldownSeconds": 2,
                        **scaling}}


def enqueue_sleeps(dsn: str, *seconds: float, queue: str = "jobs") -> list[int]:
    with psycopg.connect(dsn) as conn:
        return enqueue_many(conn, [{"task": "qw.sleep", "payload": {"seconds": s}, "queue": queue} for s in seconds])


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


# --- tests ---------------------------------------------------------------------------------------------

def test_minimal_queueworker_gets_an_owned_deployment_and_a_filled_status(cluster: Cluster):
    cluster.apply("emails", {"queue": "emails", "image": "registry.example/app-worker:1.4", "handlers": "app.tasks",
                             "database": {"secretRef": {"name": DB_SECRET, "key": "url"}},
                             "scaling": {"maxReplicas": 20}})
    deployment = cluster.wait_for(lambda: cluster.apps.read_namespaced_deployment("emails-worker", cluster.namespace),
                                  message="Deployment emails-worker")
    qw = cluster.queueworker("emails")
    (owner,) = deployment.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.controller) == \
        ("QueueWorker", "emails", qw["metadata"]["uid"], True)
    container = deployment.spec.template.spec.containers[0]
    assert container.command is None and container.args[:3] == ["worker", "--queue", "emails"]
    env = {e.name: e.value_from for e in container.env}
    assert env["DATABASE_URL"].secret_key_ref.name == DB_SECRET
    assert env["POD_NAME"].field_ref.field_path == "metadata.name"
    assert deployment.spec.replicas == 0 and deployment.spec.template.spec.termination_grace_period_seconds == 30

    status = cluster.wait_for(lambda: cluster.queueworker("emails").get("status", {}).get("queueDepth") and
                              cluster.queueworker("emails")["status"], message="status filled")
    assert (status["replicas"], status["desiredReplicas"], status["reason"]) == (0, 0, "Idle")
    assert status["queueDepth"]["ready"] == 0 and status["observedGeneration"] == qw["metadata"]["generation"]
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {"Ready": "True", "Active": "False", "Paused": "False", "Fallback": "False",
                          "DrainSafe": "True"}

    response = cluster.custom.list_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL, _preload_content=False,
        _headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    table = json.loads(response.data)
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert columns == ["Name", "Queue", "Ready", "Running", "Desired", "Replicas", "Reason", "Age"]
    assert table["rows"][0]["cells"][:6] == ["emails", "emails", 0, 0, 0, 0]
    liveness = urllib.request.urlopen(f"http://127.0.0.1:{cluster.liveness_port}/healthz", timeout=5)
    assert liveness.status == 200  # the chart's livenessProbe


def test_missing_secret_is_reported_and_recovers_when_created(cluster: Cluster, dsn: str):
    cluster.apply("nosecret", {**worker_spec(maxReplicas=2), "database": {"secretRef": {"name": "later"}}})
    cluster.wait_for(lambda: cluster.condition("nosecret", "Ready").get("reason") == "SecretUnavailable",
                     message="Ready=False SecretUnavailable")
    (event,) = cluster.wait_for(lambda: cluster.events("SecretUnavailable"), message="Warning Event")
    assert event.type == "Warning" and "later" in event.message
    cluster.core.create_namespaced_secret(cluster.namespace,
                                          {"metadata": {"name": "later"}, "stringData": {"url": dsn}})
    cluster.wait_for(lambda: cluster.condition("nosecret", "Ready").get("status") == "True", message="Ready again")


def test_backlog_scales_up_in_one_step_drains_and_returns_to_min(cluster: Cluster, dsn: str):
    cluster.apply("sleepers", {**worker_spec(maxReplicas=4), "concurrency": 5})
    cluster.wait_for(lambda: cluster.queueworker("sleepers").get("status", {}).get("reason") == "Idle",
                     message="idle at zero")
    enqueued_at = time.monotonic()
    enqueue_sleeps(dsn, *[0.2] * 200)
    seen = [0]

    def replicas_changed() -> bool:
        replicas = cluster.replicas("sleepers")
        if replicas != seen[-1]:
            seen.append(replicas)
        return replicas != 0
    cluster.wait_for(replicas_changed, timeout=30, message="scale up")
    reaction = time.monotonic() - enqueued_at
    assert seen == [0, 4], f"one step to maxReplicas, saw {seen}"
    print(f"reaction time (backlog -> replicas patched): {reaction:.2f}s")

    cluster.wait_for(lambda: task_report(dsn)["states"] == {"succeeded": 200}, timeout=90,
                     message="200 tasks succeeded")
    assert task_report(dsn)["succeeded_more_than_once"] == 0
    cluster.wait_for(lambda: cluster.replicas("sleepers") == 0, timeout=30, message="back to minReplicas=0")
    reasons = {e.reason for e in cluster.events("Activated") + cluster.events("ScaledToZero")}
    assert reasons == {"Activated", "ScaledToZero"}
    metrics = cluster.metrics()
    labels = f'name="sleepers",namespace="{cluster.namespace}"'  # the exposition sorts label names
    assert f'queueworker_controller_scale_total{{direction="up",{labels}}} 1.0' in metrics
    assert f"queueworker_controller_desired_replicas{{{labels}}} 0.0" in metrics
    assert "queueworker_controller_tick_duration_seconds_count" in metrics


def test_scale_down_spares_busy_pods_and_a_deleted_busy_pod_loses_nothing(cluster: Cluster, dsn: str):
    cluster.apply("mixed", worker_spec(maxReplicas=3, cooldownSeconds=600))
    (long_task, *_) = enqueue_sleeps(dsn, 20, 0.5, 0.5)
    cluster.wait_for(lambda: cluster.replicas("mixed") == 3, timeout=30, message="3 replicas")
    busy_pod = cluster.wait_for(lambda: lease_holders(dsn).get(long_task), timeout=60, message="long task leased")

    cluster.wait_for(lambda: cluster.replicas("mixed") == 1, timeout=40, message="scale-in to 1")
    survivors = cluster.wait_for(lambda: (lambda pods: len(pods) == 1 and pods)(cluster.pods("mixed")), timeout=30,
                                 message="one pod left")
    assert survivors[0].metadata.name == busy_pod, "the pod holding a lease was deleted on scale-in"
    assert int(survivors[0].metadata.annotations[DELETION_COST_ANNOTATION]) > 0
    assert lease_holders(dsn).get(long_task) == busy_pod  # still running where it was

    # Deleting the busy pod: it drains for 1 s, hands the task back, and the replacement finishes it.
    cluster.core.delete_namespaced_pod(busy_pod, cluster.namespace)
    cluster.wait_for(lambda: task_report(dsn)["states"] == {"succeeded": 3}, timeout=90, message="all succeeded")
    with psycopg.connect(dsn) as conn:
        transitions = conn.execute("SELECT from_state::text, to_state::text FROM queueworker.task_events "
                                   "WHERE task_id = %s ORDER BY id", (long_task,)).fetchall()
        attempts = conn.execute("SELECT attempts FROM queueworker.tasks WHERE id = %s", (long_task,)).fetchone()[0]
    assert ("running", "pending") in transitions  # released, not lost to a lease expiry
    assert transitions.count(("running", "succeeded")) == 1 and attempts == 1
    assert task_report(dsn)["succeeded_more_than_once"] == 0


def test_database_outage_holds_replicas_says_why_and_recovers(cluster: Cluster, dsn: str, local_postgres):
    cluster.apply("steady", worker_spec(maxReplicas=3))
    enqueue_sleeps(dsn, 120, 120)
    cluster.wait_for(lambda: cluster.replicas("steady") == 2, timeout=30, message="2 replicas")
    local_postgres.stop()
    try:
        cluster.wait_for(lambda: cluster.condition("steady", "Ready").get("reason") == "DatabaseUnreachable",
                         timeout=30, message="Ready=False DatabaseUnreachable")
        assert cluster.condition("steady", "Ready")["status"] == "False"
        cluster.wait_for(lambda: cluster.events("DatabaseUnreachable"), timeout=15, message="Warning Event")
        time.sleep(6)  # three times stabilization + cooldown
        assert cluster.replicas("steady") == 2
        assert cluster.queueworker("steady")["status"]["reason"] == "HoldingOnError"
    finally:
        local_postgres.start()
    cluster.wait_for(lambda: cluster.condition("steady", "Ready").get("status") == "True", timeout=30,
                     message="Ready again")
    cluster.wait_for(lambda: cluster.events("Recovered"), timeout=15, message="Recovered Event")
    assert cluster.replicas("steady") == 2


INVALID = [
    ("bad-type", {"concurrency": "ten"}, "spec.concurrency in body must be of type integer"),
    ("min-above-max", {"scaling": {"minReplicas": 5, "maxReplicas": 2}}, "minReplicas must not be greater"),
    ("missing-queue", {"queue": None}, "spec.queue: Required value"),
    ("empty-queue", {"queue": ""}, "spec.queue: Invalid value"),
    ("negative-min", {"scaling": {"minReplicas": -1}}, "spec.scaling.minReplicas: Invalid value: -1"),
    ("zero-concurrency", {"concurrency": 0}, "spec.concurrency: Invalid value: 0"),
    ("unknown-field", {"replicas": 3}, "unknown field \"spec.replicas\""),
    ("inline-password", {"database": {"url": "postgresql://u:p@db/app"}}, 'unknown field "spec.database.url"'),
    ("fallback-above-max", {"scaling": {"maxReplicas": 2, "fallbackReplicas": 5}},
     "fallbackReplicas must lie between"),
    ("short-lease", {"leaseSeconds": 1}, "spec.leaseSeconds: Invalid value: 1"),
]


@pytest.mark.parametrize(("case", "change", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_queueworkers_are_rejected_with_a_clear_message(control_plane, crd, cluster_namespace,
                                                                 case, change, message):
    spec = {"queue": "q", "image": "i", "database": {"secretRef": {"name": "db"}}, **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    with control_plane.api_client() as api:
        with pytest.raises(ApiException) as raised:
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                GROUP, VERSION, cluster_namespace, PLURAL,
                {"apiVersion": f"{GROUP}/{VERSION}", "kind": "QueueWorker", "metadata": {"name": case}, "spec": spec},
                field_validation="Strict")
    assert raised.value.status in (400, 422)
    assert message in json.loads(raised.value.body)["message"]


def test_controller_identity_has_only_the_chart_rules(control_plane, controller_kubeconfig):
    """The tests above ran as this ServiceAccount; it must not be an admin in disguise."""
    from kubernetes import config
    api = config.new_client_from_config(config_file=str(controller_kubeconfig))
    review = client.AuthorizationV1Api(api).create_self_subject_access_review(
        {"spec": {"resourceAttributes": {"verb": "delete", "resource": "pods", "namespace": "default"}}})
    assert review.status.allowed is False
    review = client.AuthorizationV1Api(api).create_self_subject_access_review(
        {"spec": {"resourceAttributes": {"verb": "patch", "resource": "deployments", "subresource": "scale",
                                         "group": "apps", "namespace": "default"}}})
    assert review.status.allowed is True


def test_spec_changes_roll_the_deployment_and_paused_leaves_kubectl_scale_alone(cluster: Cluster, dsn: str):
    cluster.apply("rolling", worker_spec(maxReplicas=3))
    cluster.wait_for(lambda: cluster.queueworker("rolling").get("status", {}).get("reason") == "Idle", message="idle")
    patch = {"spec": {"concurrency": 3, "scaling": {"paused": True}}}
    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, "rolling", patch)
    cluster.wait_for(lambda: "3" in cluster.apps.read_namespaced_deployment(
        "rolling-worker", cluster.namespace).spec.template.spec.containers[0].args, message="new args rolled out")
    cluster.wait_for(lambda: cluster.condition("rolling", "Paused").get("status") == "True", message="Paused=True")

    cluster.apps.patch_namespaced_deployment_scale("rolling-worker", cluster.namespace, {"spec": {"replicas": 2}})
    time.sleep(4)  # several polls with an empty queue: unpaused, this would be scaled to zero
    assert cluster.replicas("rolling") == 2
    assert cluster.queueworker("rolling")["status"]["reason"] == "Paused"

    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, "rolling",
                                                  {"spec": {"scaling": {"paused": False}}})
    cluster.wait_for(lambda: cluster.replicas("rolling") == 0, timeout=30, message="scaling resumed")
