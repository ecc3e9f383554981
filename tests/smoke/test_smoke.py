"""The chart end to end in a real cluster (kind, or the local real node: see harness.py): install,
scale a burst up and down, survive a deleted busy pod, uninstall. Run with `make smoke`.

The tests share one release and run in file order; the last one uninstalls it.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from .harness import DEMO_POSTGRES, NAMESPACE, RELEASE, WORKER_IMAGE, Smoke, wait_for

pytestmark = [pytest.mark.smoke, pytest.mark.timeout(1800)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FAST_SCALING = {"pollingIntervalSeconds": 2, "scaleDownStabilizationSeconds": 10, "cooldownSeconds": 10}


def test_helm_test_passes(smoke: Smoke):
    smoke.cluster.helm_cmd("test", RELEASE, "--timeout", "3m")


def test_burst_scales_up_runs_every_task_once_and_scales_back_down(smoke: Smoke):
    smoke.apply_queueworker("burst", "smoke-burst", concurrency=10, drainSeconds=5,
                            scaling={"minReplicas": 0, "maxReplicas": 5, "tasksPerReplica": 20, **FAST_SCALING})
    smoke.enqueue_sleeps("smoke-burst", 300, seconds=1.0)

    peak = 0

    def observed_replicas() -> int:
        nonlocal peak
        peak = max(peak, smoke.worker_replicas("burst"))
        return peak

    wait_for(lambda: observed_replicas() >= 2, 120, "the controller to scale the workers up")

    def all_finished() -> bool:
        observed_replicas()
        return smoke.scalar("SELECT count(*) FROM queueworker.tasks WHERE queue = 'smoke-burst' "
                            "AND state IN ('succeeded', 'failed', 'cancelled')") == 300

    wait_for(all_finished, 600, "all 300 tasks to finish")
    assert peak == 5, "300 ready tasks at 20 per replica ask for maxReplicas"

    states = dict(smoke.psql("SELECT state, count(*) FROM queueworker.tasks WHERE queue = 'smoke-burst' "
                             "GROUP BY state"))
    assert states == {"succeeded": "300"}
    # Exactly once: one `succeeded` transition per task in the audit trail, none recorded twice.
    (succeeded_events, tasks) = smoke.psql(
        "SELECT count(*), count(DISTINCT e.task_id) FROM queueworker.task_events e "
        "JOIN queueworker.tasks t ON t.id = e.task_id "
        "WHERE t.queue = 'smoke-burst' AND e.to_state = 'succeeded'")[0]
    assert (succeeded_events, tasks) == ("300", "300")

    wait_for(lambda: smoke.worker_replicas("burst") == 0, 180, "the workers to scale back to zero")
    wait_for(lambda: not smoke.core.list_namespaced_pod(
        NAMESPACE, label_selector="queueworker.dev/queueworker=burst").items, 120, "the worker pods to go")
    assert smoke.scalar("SELECT count(*) FROM queueworker.workers WHERE 'smoke-burst' = ANY(queues)") == 0
    smoke.delete_queueworker("burst")


def test_deleted_busy_pod_hands_its_task_to_another_worker(smoke: Smoke):
    """Two fixed workers, four long tasks: a deleted pod drains (2 s, too short for its tasks), hands
    its leases back without spending an attempt, and another worker finishes them."""
    smoke.apply_queueworker("kill", "smoke-kill", concurrency=2, drainSeconds=2,
                            scaling={"minReplicas": 2, "maxReplicas": 2, **FAST_SCALING})
    smoke.enqueue_sleeps("smoke-kill", 4, seconds=20.0)
    wait_for(lambda: smoke.scalar("SELECT count(*) FROM queueworker.tasks "
                                  "WHERE queue = 'smoke-kill' AND state = 'running'") == 4,
             180, "both workers to lease two tasks each")
    task_id, worker_id, pod_name = smoke.psql(
        "SELECT t.id, w.id, w.pod_name FROM queueworker.tasks t JOIN queueworker.workers w ON w.id = t.lease_owner "
        "WHERE t.queue = 'smoke-kill' AND t.state = 'running' ORDER BY t.id LIMIT 1")[0]
    assert pod_name, "workers record their pod name (POD_NAME from the downward API)"

    smoke.core.delete_namespaced_pod(pod_name, NAMESPACE)

    wait_for(lambda: smoke.psql(f"SELECT state FROM queueworker.tasks WHERE id = {task_id}")[0][0] == "succeeded",
             180, f"task {task_id} to succeed on another worker")
    events = smoke.psql(f"SELECT from_state, to_state, worker FROM queueworker.task_events "
                        f"WHERE task_id = {task_id} ORDER BY id")
    assert ["running", "pending", worker_id] in events, f"the deleted pod's worker handed the lease back: {events}"
    (finisher,) = [worker for _, to_state, worker in events if to_state == "succeeded"]
    assert finisher not in ("", worker_id), f"another worker finished it: {events}"
    assert smoke.scalar(f"SELECT attempts FROM queueworker.tasks WHERE id = {task_id}") == 1
    smoke.delete_queueworker("kill")


def test_the_examples_applied_with_kubectl_scale_a_backlog_up_and_back_to_zero(smoke: Smoke, tmp_path):
    """What the README and examples/queueworker.yaml tell a user to type, with a real kubectl: apply
    the Secret and the QueueWorker, `kubectl get qw`, enqueue a backlog, watch the workers come and
    go, `kubectl delete`. The files change only where they say to: the Secret's URL (here the demo
    Postgres's), the image (the one loaded on the node), and the scaling timers (seconds, not
    minutes, so that the test waits less)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed") if os.environ.get("CI") else pytest.skip("kubectl is not installed")
    demo_url = base64.b64decode(smoke.core.read_namespaced_secret(DEMO_POSTGRES, NAMESPACE).data["url"]).decode()
    secret = yaml.safe_load((EXAMPLES / "database-secret.yaml").read_text())
    secret["stringData"]["url"] = demo_url
    queueworker = yaml.safe_load((EXAMPLES / "queueworker.yaml").read_text())
    queueworker["spec"]["image"] = WORKER_IMAGE
    queueworker["spec"]["scaling"].update(FAST_SCALING)
    files = [tmp_path / "database-secret.yaml", tmp_path / "queueworker.yaml"]
    for path, document in zip(files, (secret, queueworker), strict=True):
        path.write_text(yaml.safe_dump(document))

    def kubectl_run(*args: str) -> str:
        done = subprocess.run([kubectl, "--kubeconfig", str(smoke.cluster.kubeconfig), "--namespace", NAMESPACE,
                               *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    applied = kubectl_run("apply", "-f", str(files[0]), "-f", str(files[1]))
    assert "secret/emails-db created" in applied and "queueworker.queueworker.dev/emails created" in applied
    wait_for(lambda: "Idle" in kubectl_run("get", "qw", "emails", "--output", "wide"), 120,
             "`kubectl get qw emails -o wide` to show it idle")

    smoke.enqueue_sleeps("emails", 40, seconds=1.0)
    wait_for(lambda: smoke.worker_replicas("emails") >= 2, 120, "the backlog to scale the workers up")
    wait_for(lambda: smoke.scalar("SELECT count(*) FROM queueworker.tasks WHERE queue = 'emails' "
                                  "AND state = 'succeeded'") == 40, 300, "the 40 tasks to succeed")
    wait_for(lambda: smoke.worker_replicas("emails") == 0, 180, "the workers to scale back to zero")

    deleted = kubectl_run("delete", "-f", str(files[1]), "-f", str(files[0]), "--wait", "--timeout", "120s")
    assert "queueworker.queueworker.dev \"emails\" deleted" in deleted and "secret \"emails-db\" deleted" in deleted
    assert "No resources found" in subprocess.run(
        [kubectl, "--kubeconfig", str(smoke.cluster.kubeconfig), "--namespace", NAMESPACE, "get", "qw"],
        capture_output=True, text=True, timeout=60).stderr


def test_uninstall_removes_the_release_and_keeps_the_crd(smoke: Smoke):
    smoke.cluster.helm_cmd("uninstall", RELEASE, "--wait", "--timeout", "3m")
    released = "app.kubernetes.io/managed-by=Helm"
    assert not smoke.apps.list_namespaced_deployment(NAMESPACE, label_selector=released).items
    assert not smoke.core.list_namespaced_service(NAMESPACE, label_selector=released).items
    rbac = client.RbacAuthorizationV1Api(smoke.api)
    assert not [r for r in rbac.list_cluster_role().items if r.metadata.name.startswith(f"{RELEASE}-controller")]
    crd = client.ApiextensionsV1Api(smoke.api).read_custom_resource_definition("queueworkers.queueworker.dev")
    assert crd.metadata.annotations["helm.sh/resource-policy"] == "keep"
