"""examples/database-secret.yaml and examples/queueworker.yaml, applied as the README says, against a
real API server with the controller running: the Secret's placeholder URL becomes the test database's
and the image the one the process kubelet runs, nothing else changes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from queueworker.db.migrate import migrate
from queueworker.scaling.resource import GROUP, PLURAL, VERSION
from tests.controller_cluster import Cluster, cluster, enqueue_sleeps, task_report  # noqa: F401

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PROCESS_KUBELET_IMAGE = "queueworker:test"  # runs the worker's entrypoint as a local process


def test_the_example_files_make_a_working_fleet(cluster: Cluster, dsn: str) -> None:
    migrate(dsn)
    secret = yaml.safe_load((EXAMPLES / "database-secret.yaml").read_text())
    queueworker = yaml.safe_load((EXAMPLES / "queueworker.yaml").read_text())
    secret["stringData"]["url"] = dsn
    queueworker["spec"]["image"] = PROCESS_KUBELET_IMAGE
    cluster.core.create_namespaced_secret(cluster.namespace, secret, field_validation="Strict")
    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, queueworker,
                                                   field_validation="Strict")
    name = queueworker["metadata"]["name"]

    deployment = cluster.wait_for(lambda: cluster.apps.read_namespaced_deployment(f"{name}-worker", cluster.namespace),
                                  message=f"Deployment {name}-worker")
    (container,) = deployment.spec.template.spec.containers
    assert container.resources.limits == {"memory": "512Mi"}
    status = cluster.wait_for(lambda: cluster.queueworker(name).get("status", {}).get("queueDepth") and
                              cluster.queueworker(name)["status"], message="status filled")
    assert status["reason"] == "Idle" and status["replicas"] == 0
    assert cluster.condition(name, "Ready")["status"] == "True"

    ids = enqueue_sleeps(dsn, 0.2, 0.2, queue=queueworker["spec"]["queue"])
    cluster.wait_for(lambda: task_report(dsn)["states"] == {"succeeded": len(ids)}, timeout=120,
                     message=lambda: f"both tasks done by the example's workers: {task_report(dsn)}")
    assert cluster.replicas(name) >= 1
