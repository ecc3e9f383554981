"""The worker Deployment builder and the spec parser behind it."""

from __future__ import annotations

from pathlib import Path

import pytest

from queueworker_controller import podsecurity
from queueworker_controller.deployment import (
    HASH_ANNOTATION, OWNER_LABEL, SECRET_VERSION_ANNOTATION, WORKER_UID, build_deployment, deployment_name,
    grace_period_seconds, merge, secret_version,
)
from queueworker_controller.spec import InvalidSpec, QueueWorkerSpec

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
                                 "--drain-seconds", "20", "--shutdown-seconds", "28",
                                 "--handlers", "app.tasks", "--metrics-port", "9100"]
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


def test_wait_for_idle_drains_for_max_wait_and_brings_new_pods_up_first():
    deployment = render(drainSeconds=45, rollout={"strategy": "WaitForIdle", "maxWaitSeconds": 900})
    args = worker_container(deployment)["args"]
    assert args[args.index("--drain-seconds") + 1] == "900", "a stopping worker waits for its tasks"
    assert grace_period_seconds(deployment) == 910 and shutdown_seconds(deployment) == 908
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": "100%", "maxUnavailable": 0}}
    drain = render(drainSeconds=45, rollout={"strategy": "Drain", "maxWaitSeconds": 900})
    assert "strategy" not in drain["spec"] and grace_period_seconds(drain) == 55
    assert "strategy" not in render()["spec"], "Drain is the default"


def shutdown_seconds(deployment) -> int:
    args = worker_container(deployment)["args"]
    return int(args[args.index("--shutdown-seconds") + 1])


@pytest.mark.parametrize(("template_grace", "drain", "grace", "shutdown"), [
    (None, 20, 30, 28),   # the default grace: drain + 10
    (None, 0, 10, 8),
    (120, 20, 120, 118),  # the template's grace wins the merge, and the budget follows it
    (2, 20, 2, 1),        # never below 1 s
    (0, 20, 0, 1),
])
def test_the_shutdown_budget_fits_the_effective_grace_period(template_grace, drain, grace, shutdown):
    template = {} if template_grace is None else {"spec": {"terminationGracePeriodSeconds": template_grace}}
    deployment = render(drainSeconds=drain, template=template)
    assert grace_period_seconds(deployment) == grace
    assert shutdown_seconds(deployment) == shutdown


def test_the_generated_pod_passes_pod_security_restricted():
    pod = render()["spec"]["template"]
    assert podsecurity.violations(pod) == []
    spec, worker = pod["spec"], worker_container(render())
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    assert worker["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                         "capabilities": {"drop": ["ALL"]}}
    assert worker["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert spec["volumes"] == [{"name": "tmp", "emptyDir": {}}]
    assert spec["automountServiceAccountToken"] is False


def test_the_template_can_ask_for_a_token_and_its_own_volumes():
    pod = render(template={"spec": {"automountServiceAccountToken": True,
                                    "volumes": [{"name": "tmp", "emptyDir": {"medium": "Memory"}},
                                                {"name": "config", "configMap": {"name": "app"}}]}})["spec"]["template"]
    assert pod["spec"]["automountServiceAccountToken"] is True
    assert pod["spec"]["volumes"] == [{"name": "tmp", "emptyDir": {"medium": "Memory"}},
                                      {"name": "config", "configMap": {"name": "app"}}]


def test_the_database_secret_version_is_on_the_pod_template():
    spec = QueueWorkerSpec.from_dict(MINIMAL)
    assert secret_version(build_deployment("emails", "prod", "uid-1", spec)) is None
    deployment = build_deployment("emails", "prod", "uid-1", spec, secret_version="4711")
    assert deployment["spec"]["template"]["metadata"]["annotations"][SECRET_VERSION_ANNOTATION] == "4711"
    assert secret_version(deployment) == "4711"
    rotated = build_deployment("emails", "prod", "uid-1", spec, secret_version="4712")
    assert rotated["metadata"]["annotations"][HASH_ANNOTATION] != deployment["metadata"]["annotations"][HASH_ANNOTATION]


@pytest.mark.parametrize("template", [
    {"metadata": {"labels": None}},
    {"metadata": None, "spec": {"nodeSelector": {"a": "b"}}},
], ids=["labels-null", "metadata-null"])
def test_a_template_that_cannot_be_merged_is_an_invalid_spec(template):
    with pytest.raises(InvalidSpec, match="template cannot be merged"):
        render(template=template)


@pytest.mark.parametrize("spec_change", [
    {"template": {"spec": {"terminationGracePeriodSeconds": "ten"}}},
    {"template": {"spec": {"terminationGracePeriodSeconds": -1}}},
    {"template": {"spec": {"terminationGracePeriodSeconds": True}}},
    {"template": "x"},
    {"template": {"spec": ["x"]}},
    {"scaling": ["x"]},
    {"database": "x"},
    {"concurrency": "ten"},
    {"rollout": {"strategy": "Recreate"}},
    {"rollout": ["x"]},
    {"rollout": {"strategy": "WaitForIdle", "maxWaitSeconds": "long"}},
], ids=["grace-text", "grace-negative", "grace-bool", "template-text", "template-spec-list", "scaling-list",
        "database-text", "concurrency-text", "rollout-unknown-strategy", "rollout-list", "rollout-wait-text"])
def test_unusable_specs_raise_invalid_spec_only(spec_change):
    with pytest.raises(InvalidSpec):
        QueueWorkerSpec.from_dict({**MINIMAL, **spec_change})


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


def test_the_pod_runs_as_the_worker_images_user():
    dockerfile = (Path(__file__).resolve().parent.parent / "Dockerfile.worker").read_text()
    (user,) = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")]
    assert user == f"{WORKER_UID}:{WORKER_UID}"
