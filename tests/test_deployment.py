"""The worker Deployment builder and the spec parser behind it."""

from __future__ import annotations

import pytest

from queueworker_controller.deployment import (
    HASH_ANNOTATION, OWNER_LABEL, build_deployment, deployment_name, grace_period_seconds, merge,
)
from queueworker_controller.spec import QueueWorkerSpec

MINIMAL = {"queue": "emails", "image": "registry.example/app-worker:1.4", "handlers": "app.tasks",
           "database": {"secretRef": {"name": "app-db", "key": "url"}}, "scaling": {"maxReplicas": 20}}


def render(**overrides):
    return build_deployment("emails", "prod", "uid-1", QueueWorkerSpec.from_dict({**MINIMAL, **overrides}))


def worker_container(deployment):
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "worker")


def test_minimal_deployment_runs_the_worker_with_the_spec_settings():
    deployment = render()
    container = worker_container(deployment)
    assert deployment["metadata"]["name"] == deployment_name("emails") == "emails-worker"
    assert "command" not in container, "the image's entrypoint (tini -- queueworker) must stay PID 1"
    assert container["args"] == ["worker", "--queue", "emails", "--concurrency", "10", "--lease-seconds", "30",
                                 "--heartbeat-seconds", "10", "--drain-seconds", "20", "--handlers", "app.tasks",
                                 "--metrics-port", "9100"]
    env = {e["name"]: e["valueFrom"] for e in container["env"]}
    assert env["DATABASE_URL"] == {"secretKeyRef": {"name": "app-db", "key": "url"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert container["ports"] == [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]


def test_owner_reference_selector_and_no_replicas():
    deployment = render()
    (owner,) = deployment["metadata"]["ownerReferences"]
    assert owner == {"apiVersion": "queueworker.dev/v1alpha1", "kind": "QueueWorker", "name": "emails",
                     "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}
    assert deployment["spec"]["selector"]["matchLabels"] == {OWNER_LABEL: "emails"}
    assert deployment["spec"]["template"]["metadata"]["labels"][OWNER_LABEL] == "emails"
    assert "replicas" not in deployment["spec"]  # the scaling loop owns it


def test_grace_period_covers_the_drain():
    assert grace_period_seconds(render(drainSeconds=45)) == 55


def test_no_handlers_and_no_metrics():
    container = worker_container(render(handlers=None, metricsPort=0))
    assert "--handlers" not in container["args"] and "--metrics-port" not in container["args"]
    assert "ports" not in container


def test_template_is_merged_over_the_generated_pod():
    deployment = render(template={
        "metadata": {"labels": {"team": "mail", OWNER_LABEL: "hijacked"}},
        "spec": {"nodeSelector": {"pool": "workers"}, "terminationGracePeriodSeconds": 120,
                 "containers": [{"name": "worker", "resources": {"limits": {"memory": "1Gi"}},
                                 "env": [{"name": "LOG_LEVEL", "value": "DEBUG"}]},
                                {"name": "sidecar", "image": "proxy:1"}],
                 "volumes": [{"name": "tmp", "emptyDir": {}}]}})
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "mail"
    assert pod["metadata"]["labels"][OWNER_LABEL] == "emails"  # the selector label cannot be overridden
    assert pod["spec"]["nodeSelector"] == {"pool": "workers"}
    assert grace_period_seconds(deployment) == 120
    assert [c["name"] for c in pod["spec"]["containers"]] == ["worker", "sidecar"]
    worker = worker_container(deployment)
    assert worker["resources"] == {"limits": {"memory": "1Gi"}}
    assert [e["name"] for e in worker["env"]] == ["DATABASE_URL", "POD_NAME", "POD_NAMESPACE", "LOG_LEVEL"]
    assert "command" not in worker and worker["args"][0] == "worker"


def test_hash_changes_with_the_spec_only():
    assert render()["metadata"]["annotations"][HASH_ANNOTATION] == render()["metadata"]["annotations"][HASH_ANNOTATION]
    assert render()["metadata"]["annotations"][HASH_ANNOTATION] != \
        render(concurrency=4)["metadata"]["annotations"][HASH_ANNOTATION]


@pytest.mark.parametrize(("base", "override", "expected"), [
    ({"a": 1, "b": {"c": 2}}, {"b": {"d": 3}}, {"a": 1, "b": {"c": 2, "d": 3}}),
    ({"l": [1, 2]}, {"l": [3]}, {"l": [3]}),
    ({"l": [{"name": "x", "v": 1}]}, {"l": [{"name": "x", "w": 2}, {"name": "y"}]},
     {"l": [{"name": "x", "v": 1, "w": 2}, {"name": "y"}]}),
    ({"a": {"b": 1}}, {"a": None}, {"a": None}),
])
def test_merge(base, override, expected):
    assert merge(base, override) == expected


def test_spec_defaults_and_effective_tasks_per_replica():
    spec = QueueWorkerSpec.from_dict({"queue": "q", "image": "i", "database": {"secretRef": {"name": "db"}}})
    assert (spec.secret_key, spec.concurrency, spec.tasks_per_replica, spec.scaling.min_replicas) == ("url", 10, 10, 0)
    spec = QueueWorkerSpec.from_dict({**MINIMAL, "concurrency": 4, "scaling": {"tasksPerReplica": 2}})
    params = spec.scaling_params()
    assert params.tasks_per_replica == 2 and params.max_replicas == 10
