"""The worker Deployment a QueueWorker owns, rendered as a plain dict.

The rendered object never carries `spec.replicas`: the replica count belongs to the scaling loop
(and to the user while paused), so re-rendering after a spec change never resets it. A hash of
the rendered object is stored as an annotation so the controller can tell whether it must update.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from .spec import GROUP, KIND, VERSION, QueueWorkerSpec

OWNER_LABEL = "queueworker.dev/queueworker"
HASH_ANNOTATION = "queueworker.dev/spec-hash"
CONTAINER_NAME = "worker"
MANAGED_BY = "queueworker-controller"


def deployment_name(queueworker_name: str) -> str:
    return f"{queueworker_name}-worker"


def selector_labels(queueworker_name: str) -> dict[str, str]:
    return {OWNER_LABEL: queueworker_name}


def worker_args(spec: QueueWorkerSpec) -> list[str]:
    """Arguments to the image's entrypoint (`tini -- queueworker`): no `command`, so the
    image's init stays PID 1 and reaps the external-command executor's orphans."""
    args = ["worker", "--queue", spec.queue, "--concurrency", str(spec.concurrency),
            "--lease-seconds", str(spec.lease_seconds), "--heartbeat-seconds", f"{spec.heartbeat_seconds:g}",
            "--drain-seconds", str(spec.drain_seconds)]
    if spec.handlers:
        args += ["--handlers", spec.handlers]
    if spec.metrics_port:
        args += ["--metrics-port", str(spec.metrics_port)]
    return args


def build_deployment(name: str, namespace: str, uid: str, spec: QueueWorkerSpec) -> dict[str, Any]:
    """The Deployment for QueueWorker `namespace/name` (uid for the owner reference), without replicas."""
    labels = {"app.kubernetes.io/name": "queueworker", "app.kubernetes.io/instance": name,
              "app.kubernetes.io/component": "worker", "app.kubernetes.io/managed-by": MANAGED_BY,
              **selector_labels(name)}
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "args": worker_args(spec),
        "env": [
            {"name": "DATABASE_URL",
             "valueFrom": {"secretKeyRef": {"name": spec.secret_name, "key": spec.secret_key}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ],
    }
    pod_annotations: dict[str, str] = {}
    if spec.metrics_port:
        container["ports"] = [{"name": "metrics", "containerPort": spec.metrics_port, "protocol": "TCP"}]
        pod_annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(spec.metrics_port)}
    generated = {
        "metadata": {"labels": dict(labels), **({"annotations": pod_annotations} if pod_annotations else {})},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": spec.default_grace_seconds},
    }
    template = merge(generated, spec.template)
    template["metadata"]["labels"].update(selector_labels(name))  # the selector must keep matching
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(name), "namespace": namespace, "labels": labels,
            "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": name, "uid": uid,
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"selector": {"matchLabels": selector_labels(name)}, "template": template},
    }
    deployment["metadata"]["annotations"] = {HASH_ANNOTATION: spec_hash(deployment)}
    return deployment


def spec_hash(deployment: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(deployment, sort_keys=True).encode()).hexdigest()[:16]


def grace_period_seconds(deployment: dict[str, Any]) -> int:
    return int(deployment["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30))


def merge(base: Any, override: Any) -> Any:
    """`override` merged over `base`: dicts key by key, lists of named items (containers, env,
    volumes, ports...) item by item on `name`, anything else replaced. Inputs are not modified."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = copy.deepcopy(base)
        for key, value in override.items():
            merged[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(override, list) and _named(base) and _named(override):
        merged_items = {item["name"]: copy.deepcopy(item) for item in base}
        for item in override:
            merged_items[item["name"]] = merge(merged_items[item["name"]], item) if item["name"] in merged_items \
                else copy.deepcopy(item)
        return list(merged_items.values())
    return copy.deepcopy(override)


def _named(items: list[Any]) -> bool:
    return all(isinstance(item, dict) and "name" in item for item in items)
