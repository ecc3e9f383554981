"""The chart end to end in a real cluster (kind, or the local real node: see harness.py): install,
scale a burst up and down, survive a deleted busy pod, uninstall. Run with `make smoke`.

The tests share one release and run in file order; the last one uninstalls it.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from .harness import NAMESPACE, RELEASE, Smoke, wait_for

pytestmark = [pytest.mark.smoke, pytest.mark.timeout(1800)]

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


def test_uninstall_removes_the_release_and_keeps_the_crd(smoke: Smoke):
    smoke.cluster.helm_cmd("uninstall", RELEASE, "--wait", "--timeout", "3m")
    released = "app.kubernetes.io/managed-by=Helm"
    assert not smoke.apps.list_namespaced_deployment(NAMESPACE, label_selector=released).items
    assert not smoke.core.list_namespaced_service(NAMESPACE, label_selector=released).items
    rbac = client.RbacAuthorizationV1Api(smoke.api)
    assert not [r for r in rbac.list_cluster_role().items if r.metadata.name.startswith(f"{RELEASE}-controller")]
    crd = client.ApiextensionsV1Api(smoke.api).read_custom_resource_definition("queueworkers.queueworker.dev")
    assert crd.metadata.annotations["helm.sh/resource-policy"] == "keep"
