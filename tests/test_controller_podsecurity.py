"""The controller's own pod-security check, on the pod it would deploy (template merged)."""

from __future__ import annotations

import pytest

from queueworker_controller.deployment import build_deployment
from queueworker_controller.podsecurity import violations
from queueworker_controller.spec import QueueWorkerSpec
from tests.pod_templates import ALLOWED, REFUSED

SPEC = {"queue": "q", "image": "worker:1", "database": {"secretRef": {"name": "db"}}}


def merged_pod(template: dict) -> dict:
    return build_deployment("w", "ns", "uid", QueueWorkerSpec.from_dict({**SPEC, "template": template}))["spec"]["template"]


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_dangerous_templates_are_refused_after_the_merge(case):
    found = violations(merged_pod(case.template))
    assert any(v.startswith(case.path) for v in found), found


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_what_workers_legitimately_need_passes(name):
    assert violations(merged_pod(ALLOWED[name])) == []


def test_every_refusal_is_reported_at_once():
    template = {"spec": {"hostNetwork": True, "hostPID": True,
                         "containers": [{"name": "worker", "securityContext": {"privileged": True, "runAsUser": 0}}],
                         "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}}
    assert len(violations(merged_pod(template))) == 5


@pytest.mark.parametrize(("pod", "expected"), [
    ("x", "template: must be an object"),
    ({"spec": "x"}, "spec: must be an object"),
    ({"spec": {"containers": "x"}}, "spec.containers: must be a list of objects"),
    ({"spec": {"initContainers": ["x"]}}, "spec.initContainers: must be a list of objects"),
    ({"spec": {"volumes": {"name": "v"}}}, "spec.volumes: must be a list of objects"),
    ({"spec": {"securityContext": ["x"]}}, "spec.securityContext: must be an object"),
    ({"spec": {"containers": [{"name": "w", "securityContext": "privileged"}]}},
     "spec.containers: every securityContext must be an object"),
    ({"metadata": {"annotations": ["x"]}}, "metadata.annotations: must be an object"),
], ids=["text", "spec-text", "containers-text", "init-item-text", "volumes-map", "context-list",
        "container-context-text", "annotations-list"])
def test_a_pod_it_cannot_read_is_refused_not_trusted(pod, expected):
    assert expected in violations(pod)
