"""The worker Deployment a QueueWorker owns, rendered as a plain dict.

The rendered object never carries `spec.replicas`: the replica count belongs to the scaling loop
(and to the user while paused), so re-rendering after a spec change never resets it. A hash of
the rendered object is stored as an annotation so the controller can tell whether it must update.

The generated pod passes the Pod Security "restricted" profile: non-root (the worker image's uid),
seccomp RuntimeDefault, every capability dropped, no privilege escalation, a read-only root
filesystem with an emptyDir on /tmp (the image's HOME and working directory), and no service
account token unless the template asks for one.

DeploymentCache keeps the worker Deployments as the API server's watch delivers them.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from queueworker.scaling.resource import API_VERSION, GROUP, KIND

from .spec import InvalidSpec, QueueWorkerSpec

# Labels and annotations the controller sets are named under the API group.
OWNER_LABEL = f"{GROUP}/queueworker"
HASH_ANNOTATION = f"{GROUP}/spec-hash"
# On the pod template: the resourceVersion of the database Secret the pods read DATABASE_URL from.
# Environment variables are read at container start, so a changed Secret must roll the pods.
SECRET_VERSION_ANNOTATION = f"{GROUP}/database-secret-version"
CONTAINER_NAME = "worker"
MANAGED_BY = "queueworker-controller"
# The worker image's user (Dockerfile.worker `USER 10001:10001`).
WORKER_UID = 10001
# Kubernetes' terminationGracePeriodSeconds for a pod that sets none.
DEFAULT_GRACE_PERIOD_SECONDS = 30
TMP_VOLUME = "tmp"


def deployment_name(queueworker_name: str) -> str:
    return f"{queueworker_name}-worker"


def selector_labels(queueworker_name: str) -> dict[str, str]:
    return {OWNER_LABEL: queueworker_name}


def worker_args(spec: QueueWorkerSpec) -> list[str]:
    """Arguments to the image's entrypoint (`tini -- queueworker`): no `command`, so the
    image's init stays PID 1 and reaps the external-command executor's orphans. The heartbeat is
    left to the worker, which derives it from the lease; `--shutdown-seconds` fits the worker's
    whole SIGTERM-to-exit budget into the pod's grace period."""
    args = ["worker", "--queue", spec.queue, "--concurrency", str(spec.concurrency),
            "--lease-seconds", str(spec.lease_seconds), "--drain-seconds", str(spec.drain_budget_seconds),
            "--shutdown-seconds", str(spec.shutdown_seconds)]
    if spec.handlers:
        args += ["--handlers", spec.handlers]
    if spec.metrics_port:
        args += ["--metrics-port", str(spec.metrics_port)]
    return args


def build_deployment(name: str, namespace: str, uid: str, spec: QueueWorkerSpec,
                     secret_version: str | None = None) -> dict[str, Any]:
    """The Deployment for QueueWorker `namespace/name` (uid for the owner reference), without replicas.
    `secret_version` (the database Secret's resourceVersion) goes on the pod template, so a changed
    Secret rolls the pods. Raises InvalidSpec when the template cannot be merged."""
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
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": TMP_VOLUME, "mountPath": "/tmp"}],
    }
    pod_annotations: dict[str, str] = {}
    if spec.metrics_port:
        container["ports"] = [{"name": "metrics", "containerPort": spec.metrics_port, "protocol": "TCP"}]
        pod_annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(spec.metrics_port)}
    if secret_version is not None:
        pod_annotations[SECRET_VERSION_ANNOTATION] = secret_version
    generated = {
        "metadata": {"labels": dict(labels), **({"annotations": pod_annotations} if pod_annotations else {})},
        "spec": {
            "containers": [container],
            "terminationGracePeriodSeconds": spec.grace_period_seconds,
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": WORKER_UID, "runAsGroup": WORKER_UID,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "volumes": [{"name": TMP_VOLUME, "emptyDir": {}}],
        },
    }
    try:
        template = merge(generated, spec.template)
        template["metadata"]["labels"].update(selector_labels(name))  # the selector must keep matching
    except (TypeError, AttributeError, KeyError) as exc:
        raise InvalidSpec(f"template cannot be merged over the generated pod: {type(exc).__name__}: {exc}") from exc
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(name), "namespace": namespace, "labels": labels,
            "ownerReferences": [{"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": uid,
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"selector": {"matchLabels": selector_labels(name)}, "template": template},
    }
    if spec.rollout.strategy == "WaitForIdle":
        # The new pods come up first (no capacity gap); the old ones then get SIGTERM, stop claiming
        # and exit once their last task is done (up to maxWaitSeconds).
        deployment["spec"]["strategy"] = {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxSurge": "100%", "maxUnavailable": 0}}
    deployment["metadata"]["annotations"] = {HASH_ANNOTATION: spec_hash(deployment)}
    return deployment


def spec_hash(deployment: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(deployment, sort_keys=True).encode()).hexdigest()[:16]


def grace_period_seconds(deployment: dict[str, Any]) -> int:
    return int(deployment["spec"]["template"]["spec"].get("terminationGracePeriodSeconds",
                                                           DEFAULT_GRACE_PERIOD_SECONDS))


def secret_version(deployment: dict[str, Any] | None) -> str | None:
    """The database Secret version the Deployment's pods were started with, if any."""
    if deployment is None:
        return None
    return ((deployment["spec"]["template"].get("metadata") or {}).get("annotations") or {}).get(
        SECRET_VERSION_ANNOTATION)


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


class DeploymentCache:
    """The worker Deployments as the API server's watch last delivered them (kopf's event handler
    feeds it, the reconciler's own reads and writes too), so a tick reads its Deployment without a
    request. A Deployment not seen yet is read with a GET. Only the event loop's thread changes it."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str], dict[str, Any]] = {}

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._items.get((namespace, name))

    def put(self, deployment: dict[str, Any]) -> None:
        """Keeps what ticks use (metadata without managedFields, the replicas, the pod template's
        annotations, the status), not the pod spec: a thousand of these stay small."""
        meta, spec = deployment["metadata"], deployment.get("spec") or {}
        template_meta = (spec.get("template") or {}).get("metadata") or {}
        self._items[(meta["namespace"], meta["name"])] = copy.deepcopy({
            "metadata": {k: v for k, v in meta.items() if k != "managedFields"},
            "spec": {"replicas": spec.get("replicas"),
                     "template": {"metadata": {"annotations": template_meta.get("annotations") or {}}}},
            "status": deployment.get("status") or {}})

    def put_fetched(self, deployment: dict[str, Any], based_on: dict[str, Any] | None) -> dict[str, Any]:
        """A Deployment this controller read (`based_on` None) or wrote over `based_on`, kept unless the
        watch delivered another view while the request was in flight; returns the view kept. The watch's
        view is then as new or newer: a write names the version it replaces, and every change comes
        back through the watch. Storing the response regardless would hide a later status (a
        ReplicaFailure set while the create was answered) until the Deployment changed again."""
        key = (deployment["metadata"]["namespace"], deployment["metadata"]["name"])
        if _resource_version(self._items.get(key)) == _resource_version(based_on):
            self.put(deployment)
        return self._items.get(key, deployment)

    def set_replicas(self, namespace: str, name: str, replicas: int) -> None:
        """A scale this controller made, on top of the newest view (whose status it keeps)."""
        cached = self._items.get((namespace, name))
        if cached is not None:
            cached["spec"]["replicas"] = replicas

    def drop(self, namespace: str, name: str) -> None:
        self._items.pop((namespace, name), None)


def _resource_version(deployment: dict[str, Any] | None) -> str | None:
    return None if deployment is None else deployment["metadata"].get("resourceVersion")
