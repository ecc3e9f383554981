"""The few Kubernetes API calls the controller makes, with the official client.

Every method blocks; the reconciler calls them through `asyncio.to_thread`. Objects come back as
plain dicts (the JSON the API server sent), which is what the pure builders and tests use.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
FIELD_MANAGER = "queueworker-controller"


class SecretUnavailable(Exception):
    """The database Secret or its key is missing or unreadable."""


def load_config() -> client.ApiClient:
    """In-cluster credentials when running in a pod, else $KUBECONFIG / ~/.kube/config."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


class Kube:
    def __init__(self, api: client.ApiClient):
        self._apps = client.AppsV1Api(api)
        self._core = client.CoreV1Api(api)

    def read_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _json(self._apps.read_namespaced_deployment(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create_deployment(self, namespace: str, body: dict[str, Any], replicas: int) -> dict[str, Any]:
        body = {**body, "spec": {**body["spec"], "replicas": replicas}}
        return _json(self._apps.create_namespaced_deployment(namespace, body, field_manager=FIELD_MANAGER,
                                                             _preload_content=False))

    def update_deployment(self, current: dict[str, Any], rendered: dict[str, Any]) -> dict[str, Any]:
        """Replaces the Deployment with `rendered`, keeping its replica count, other writers' labels and
        annotations (e.g. the deployment controller's revision) and resourceVersion (a conflict raises
        and the next tick retries with a fresh read)."""
        meta, ours = current["metadata"], rendered["metadata"]
        body = {**rendered,
                "metadata": {**ours, "resourceVersion": meta["resourceVersion"],
                             "labels": {**(meta.get("labels") or {}), **ours["labels"]},
                             "annotations": {**(meta.get("annotations") or {}), **ours["annotations"]}},
                "spec": {**rendered["spec"], "replicas": current["spec"].get("replicas", 1)}}
        return _json(self._apps.replace_namespaced_deployment(meta["name"], meta["namespace"], body,
                                                              field_manager=FIELD_MANAGER,
                                                              _preload_content=False))

    def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        self._apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": replicas}},
                                                     field_manager=FIELD_MANAGER)

    def read_secret_value(self, namespace: str, name: str, key: str) -> str:
        try:
            secret = self._core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            raise SecretUnavailable(f"Secret {namespace}/{name}: {exc.reason} ({exc.status})") from None
        if key not in (secret.data or {}):
            raise SecretUnavailable(f"Secret {namespace}/{name} has no key {key!r}")
        return base64.b64decode(secret.data[key]).decode()

    def list_pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        label_selector = ",".join(f"{k}={v}" for k, v in selector.items())
        return _json(self._core.list_namespaced_pod(namespace, label_selector=label_selector,
                                                    _preload_content=False))["items"]

    def set_deletion_cost(self, namespace: str, pod: str, cost: int) -> None:
        patch = {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(cost)}}}
        try:
            self._core.patch_namespaced_pod(pod, namespace, patch, field_manager=FIELD_MANAGER)
        except ApiException as exc:
            if exc.status != 404:  # the pod went away meanwhile: nothing to price
                raise


def _json(response: Any) -> Any:
    return json.loads(response.data)
