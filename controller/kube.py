"""The few Kubernetes API calls the controller makes, with the official client.

Every method blocks; the reconciler runs them on a thread pool of their own (never shared with
database work) and every request has a timeout (REQUEST_TIMEOUT), so a slow API server delays
ticks but cannot pin threads forever. Objects come back as plain dicts (the JSON the API server
sent), which is what the pure builders and tests use.
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from kubernetes import client, config, dynamic
from kubernetes.client.rest import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError, ResourceNotUniqueError

from queueworker.scaling.resource import GROUP, PLURAL, VERSION

from .spec import ScaleTarget

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
FIELD_MANAGER = "queueworker-controller"
# (connect, read) seconds for every request.
REQUEST_TIMEOUT = (5, 20)
MERGE_PATCH = "application/merge-patch+json"
# The collections the controller reads and writes (request_json's paths).
DEPLOYMENTS = "/apis/apps/v1/namespaces/{namespace}/deployments"
PODS = "/api/v1/namespaces/{namespace}/pods"
SECRETS = "/api/v1/namespaces/{namespace}/secrets"
QUEUEWORKERS = f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{PLURAL}"


class SecretUnavailable(Exception):
    """The database Secret or its key is missing or unreadable."""


class ScaleTargetUnavailable(Exception):
    """A scaleTargetRef names no resource the API server knows, or one without a `scale` subresource."""


@dataclass(frozen=True)
class FoundScaleTarget:
    scale: dict[str, Any]  # its Scale (spec.replicas, status.replicas, status.selector)
    workload: dict[str, Any] | None  # the object itself, when it may be read (its pod template, conditions)


@dataclass(frozen=True)
class SecretValue:
    """One key of a Secret, raw: a Secret may hold any bytes, decoding is the caller's business."""

    data: bytes = field(repr=False)
    version: str  # the Secret's resourceVersion


def api_error(exc: ApiException) -> str:
    """`422 Unprocessable Entity: <the API server's message>` for an ApiException. The API server's
    message names fields and values of the objects the controller sends, which never hold a secret."""
    message = ""
    try:
        message = str(json.loads(exc.body or "{}").get("message") or "")
    except (ValueError, AttributeError):
        pass
    return f"{exc.status} {exc.reason}" + (f": {message[:500]}" if message else "")


def load_config() -> client.ApiClient:
    """In-cluster credentials when running in a pod, else $KUBECONFIG / ~/.kube/config."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def _always_allowed() -> None:
    pass


class Kube:
    """`before_write` runs before every write (leader election's check that this replica still leads)."""

    def __init__(self, api: client.ApiClient, before_write: Callable[[], None] = _always_allowed):
        self._api = api
        self._before_write = before_write

    def read_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return request_json(self._api, "GET", _path(DEPLOYMENTS, namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create_deployment(self, namespace: str, body: dict[str, Any], replicas: int) -> dict[str, Any]:
        self._before_write()
        body = {**body, "spec": {**body["spec"], "replicas": replicas}}
        return request_json(self._api, "POST", _path(DEPLOYMENTS, namespace), body=body)

    def update_deployment(self, current: dict[str, Any], rendered: dict[str, Any]) -> dict[str, Any]:
        """Replaces the Deployment with `rendered`, keeping its replica count, other writers' labels and
        annotations (e.g. the deployment controller's revision) and resourceVersion (a conflict raises
        and the next tick retries with a fresh read)."""
        self._before_write()
        meta, ours = current["metadata"], rendered["metadata"]
        body = {**rendered,
                "metadata": {**ours, "resourceVersion": meta["resourceVersion"],
                             "labels": {**(meta.get("labels") or {}), **ours["labels"]},
                             "annotations": {**(meta.get("annotations") or {}), **ours["annotations"]}},
                "spec": {**rendered["spec"], "replicas": current["spec"].get("replicas", 1)}}
        return request_json(self._api, "PUT", _path(DEPLOYMENTS, meta["namespace"], meta["name"]), body=body)

    def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        self._before_write()
        request_json(self._api, "PATCH", _path(DEPLOYMENTS, namespace, name, "scale"),
                     body={"spec": {"replicas": replicas}}, content_type=MERGE_PATCH)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """A merge patch of a QueueWorker's status subresource (a QueueWorker deleted meanwhile is ignored)."""
        self._before_write()
        try:
            request_json(self._api, "PATCH", _path(QUEUEWORKERS, namespace, name, "status"),
                         body={"status": status}, content_type=MERGE_PATCH)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def read_scale_target(self, namespace: str, ref: ScaleTarget) -> FoundScaleTarget:
        """A scaleTargetRef's Scale, and the object itself where the controller may read it."""
        resource = self._scalable(ref)
        scale = self._dynamic.get(resource.scale, name=ref.name, namespace=namespace,
                                  _request_timeout=REQUEST_TIMEOUT).to_dict()
        try:
            workload = self._dynamic.get(resource, name=ref.name, namespace=namespace,
                                         _request_timeout=REQUEST_TIMEOUT).to_dict()
        except ApiException as exc:
            if exc.status != 403:  # the rules need not allow reading it: its Scale is enough
                raise
            workload = None
        return FoundScaleTarget(scale, workload)

    def scale_target(self, namespace: str, ref: ScaleTarget, replicas: int) -> None:
        """Sets the target's replicas through its `scale` subresource, and nothing else."""
        self._before_write()
        self._dynamic.patch(self._scalable(ref).scale, body={"spec": {"replicas": replicas}}, name=ref.name,
                            namespace=namespace, content_type="application/merge-patch+json",
                            field_manager=FIELD_MANAGER, _request_timeout=REQUEST_TIMEOUT)

    def _scalable(self, ref: ScaleTarget) -> Any:
        try:
            resource = self._dynamic.resources.get(api_version=ref.api_version, kind=ref.kind)
        except (ResourceNotFoundError, ResourceNotUniqueError) as exc:
            raise ScaleTargetUnavailable(f"the API server knows no single resource of kind {ref.kind} in "
                                         f"{ref.api_version} ({type(exc).__name__})") from None
        if "scale" not in resource.subresources:
            raise ScaleTargetUnavailable(f"{ref.kind} has no scale subresource")
        return resource

    @functools.cached_property
    def _dynamic(self) -> dynamic.DynamicClient:
        """Discovery on first use only (a QueueWorker with a scaleTargetRef), cached in memory."""
        return dynamic.DynamicClient(self._api, discoverer=dynamic.discovery.LazyDiscoverer, cache_file=None)

    def read_secret(self, namespace: str, name: str, key: str) -> SecretValue:
        """The raw value of one key. SecretUnavailable (with a secret-free message) when the Secret
        or the key is missing or cannot be read."""
        try:
            secret = request_json(self._api, "GET", _path(SECRETS, namespace, name))
        except ApiException as exc:
            raise SecretUnavailable(f"Secret {namespace}/{name}: {exc.reason} ({exc.status})") from None
        data = secret.get("data") or {}
        if key not in data:
            raise SecretUnavailable(f"Secret {namespace}/{name} has no key {key!r}")
        return SecretValue(base64.b64decode(data[key]), secret["metadata"]["resourceVersion"])

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return request_json(self._api, "GET", _path(PODS, namespace), query={"labelSelector": label_selector})["items"]

    def set_deletion_cost(self, namespace: str, pod: str, cost: int) -> None:
        patch = {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(cost)}}}
        self._before_write()
        try:
            request_json(self._api, "PATCH", _path(PODS, namespace, pod), body=patch, content_type=MERGE_PATCH)
        except ApiException as exc:
            if exc.status != 404:  # the pod went away meanwhile: nothing to price
                raise


def request_json(api: client.ApiClient, method: str, path: str, *, body: Any = None, query: dict[str, str] | None = None,
                 content_type: str = "application/json") -> Any:
    """One request through the client's configuration (credentials, TLS, token refresh), as JSON in
    and out, without the client's typed API classes: importing those loads hundreds of model
    classes, over a second of CPU before a controller (or a standby taking over) can act, to
    describe objects the controller reads as plain JSON anyway. Non-2xx answers raise ApiException,
    as the typed calls do; every write names the field manager."""
    params = {**(query or {}), **({"fieldManager": FIELD_MANAGER} if method != "GET" else {})}
    headers = {"Accept": "application/json", **({"Content-Type": content_type} if body is not None else {})}
    method, url, headers, body, _ = api.param_serialize(method=method, resource_path=path, query_params=list(params.items()),
                                                        header_params=headers, body=body, auth_settings=["BearerToken"])
    response = api.call_api(method, url, header_params=headers, body=body, _request_timeout=REQUEST_TIMEOUT)
    data = response.read()
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=data.decode("utf-8", "replace"), data=None)
    return json.loads(data)


def _path(collection: str, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    """`collection` with `{namespace}` filled, then the object's name and subresource (each quoted)."""
    parts = [collection.format(namespace=quote(namespace, safe=""))]
    parts += [quote(part, safe="") for part in (name, subresource) if part is not None]
    return "/".join(parts)


def response_json(response: Any) -> Any:
    """The JSON body of a typed call made with `_preload_content=False`."""
    return json.loads(response.data)
