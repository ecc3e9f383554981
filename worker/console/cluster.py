"""The QueueWorkers' last scaling decisions, read from the Kubernetes API when the console can reach
it (in-cluster config, or --kubeconfig). Without access the page says why, and nothing else fails."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..scaling.resource import GROUP, PLURAL, VERSION, StatusField
LIST_LIMIT = 500
REQUEST_TIMEOUT_SECONDS = 5


@dataclass
class QueueWorkerStatus:
    namespace: str
    name: str
    queue: str
    replicas: Any
    desired: Any
    ready_replicas: Any
    reason: str
    message: str
    last_scale_time: str
    last_poll_time: str
    queue_depth: dict[str, Any]
    conditions: list[dict[str, Any]]


@dataclass
class ScalingView:
    items: list[QueueWorkerStatus]
    unavailable: str | None = None  # why the cluster could not be read


class ClusterReader:
    """Loads the client configuration once; lists QueueWorkers on every call: in every namespace, or
    in each of `namespaces` (what a console allowed to read those namespaces only can list)."""

    def __init__(self, kubeconfig: str | None, namespaces: Sequence[str] = ()):
        self.kubeconfig = kubeconfig
        self.namespaces = tuple(namespaces)
        self._api: Any = None
        self._unavailable: str | None = None

    def _connect(self) -> Any:
        if self._api is not None or self._unavailable is not None:
            return self._api
        try:
            from kubernetes import client, config
        except ImportError:
            self._unavailable = "the kubernetes client is not installed (pip install 'queueworker[console]')"
            return None
        try:
            if self.kubeconfig:
                api_client = config.new_client_from_config(config_file=self.kubeconfig)
            else:
                config.load_incluster_config()
                api_client = client.ApiClient()
        except Exception as exc:  # noqa: BLE001 - a missing or unreadable configuration of any kind
            source = f"the kubeconfig {self.kubeconfig!r}" if self.kubeconfig else "the in-cluster configuration"
            self._unavailable = f"no cluster access: {source} cannot be used ({type(exc).__name__})"
            return None
        self._api = client.CustomObjectsApi(api_client)
        return self._api

    def scaling(self) -> ScalingView:
        api = self._connect()
        if api is None:
            return ScalingView([], self._unavailable)
        items: list[dict[str, Any]] = []
        for namespace in self.namespaces or (None,):
            try:
                if namespace is None:
                    listed = api.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=LIST_LIMIT,
                                                            _request_timeout=REQUEST_TIMEOUT_SECONDS)
                else:
                    listed = api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, limit=LIST_LIMIT,
                                                               _request_timeout=REQUEST_TIMEOUT_SECONDS)
            except Exception as exc:  # noqa: BLE001 - any API or network failure is shown, never raised
                status = getattr(exc, "status", None)
                detail = f"HTTP {status} {getattr(exc, 'reason', '')}".strip() if status else type(exc).__name__
                where = f" in namespace {namespace}" if namespace else ""
                return ScalingView([_status(item) for item in items], f"cannot list QueueWorkers{where}: {detail}")
            items += listed.get("items", [])
        return ScalingView([_status(item) for item in items])


def _status(item: dict[str, Any]) -> QueueWorkerStatus:
    meta, spec, status = item.get("metadata", {}), item.get("spec", {}), item.get("status") or {}
    return QueueWorkerStatus(
        namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")), queue=str(spec.get("queue", "")),
        replicas=status.get(StatusField.REPLICAS), desired=status.get(StatusField.DESIRED_REPLICAS),
        ready_replicas=status.get(StatusField.READY_REPLICAS), reason=str(status.get(StatusField.REASON, "")),
        message=str(status.get(StatusField.MESSAGE, "")),
        last_scale_time=str(status.get(StatusField.LAST_SCALE_TIME, "")),
        last_poll_time=str(status.get(StatusField.LAST_POLL_TIME, "")),
        queue_depth=dict(status.get(StatusField.QUEUE_DEPTH) or {}),
        conditions=[c for c in status.get(StatusField.CONDITIONS) or [] if isinstance(c, dict)])
