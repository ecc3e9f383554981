"""The QueueWorker spec as typed values, with the same defaults as the CRD schema.

The API server applies the schema defaults, so `from_body` only fills them in for objects that
were stored before a default existed; tests/test_crd.py checks both agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .policy import ScalingParams

GROUP = "queueworker.dev"
VERSION = "v1alpha1"
PLURAL = "queueworkers"
KIND = "QueueWorker"

DEFAULT_CONCURRENCY = 10
DEFAULT_LEASE_SECONDS = 30
DEFAULT_DRAIN_SECONDS = 20
DEFAULT_METRICS_PORT = 9100
DEFAULT_SECRET_KEY = "url"
# Time a worker needs after its drain to hand leases back and exit, added to the grace period.
SHUTDOWN_MARGIN_SECONDS = 10


@dataclass(frozen=True)
class Scaling:
    min_replicas: int = 0
    max_replicas: int = 10
    tasks_per_replica: int | None = None  # None: concurrency
    activation_tasks: int = 0
    polling_interval_seconds: int = 5
    scale_down_stabilization_seconds: int = 300
    cooldown_seconds: int = 300
    fallback_replicas: int | None = None
    paused: bool = False
    dry_run: bool = False


@dataclass(frozen=True)
class QueueWorkerSpec:
    queue: str
    image: str
    secret_name: str
    secret_key: str = DEFAULT_SECRET_KEY
    handlers: str | None = None
    concurrency: int = DEFAULT_CONCURRENCY
    lease_seconds: int = DEFAULT_LEASE_SECONDS
    drain_seconds: int = DEFAULT_DRAIN_SECONDS
    metrics_port: int = DEFAULT_METRICS_PORT
    scaling: Scaling = field(default_factory=Scaling)
    template: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> QueueWorkerSpec:
        """Raises KeyError/TypeError/ValueError for a spec the schema should have refused."""
        secret_ref = spec["database"]["secretRef"]
        scaling = spec.get("scaling") or {}
        defaults = Scaling()
        return cls(
            queue=str(spec["queue"]), image=str(spec["image"]), secret_name=str(secret_ref["name"]),
            secret_key=str(secret_ref.get("key", DEFAULT_SECRET_KEY)), handlers=spec.get("handlers") or None,
            concurrency=int(spec.get("concurrency", DEFAULT_CONCURRENCY)),
            lease_seconds=int(spec.get("leaseSeconds", DEFAULT_LEASE_SECONDS)),
            drain_seconds=int(spec.get("drainSeconds", DEFAULT_DRAIN_SECONDS)),
            metrics_port=int(spec.get("metricsPort", DEFAULT_METRICS_PORT)),
            template=dict(spec.get("template") or {}),
            scaling=Scaling(**{
                attr: (None if scaling.get(key) is None else type_(scaling[key])) if key in scaling
                else getattr(defaults, attr)
                for attr, key, type_ in _SCALING_FIELDS}),
        )

    @property
    def heartbeat_seconds(self) -> float:
        """A third of the lease, so two heartbeats can fail before the lease expires."""
        return self.lease_seconds / 3

    @property
    def tasks_per_replica(self) -> int:
        return self.scaling.tasks_per_replica or self.concurrency

    @property
    def default_grace_seconds(self) -> int:
        return self.drain_seconds + SHUTDOWN_MARGIN_SECONDS

    def scaling_params(self) -> ScalingParams:
        s = self.scaling
        return ScalingParams(
            min_replicas=s.min_replicas, max_replicas=s.max_replicas, tasks_per_replica=self.tasks_per_replica,
            activation_tasks=s.activation_tasks,
            scale_down_stabilization_seconds=s.scale_down_stabilization_seconds,
            cooldown_seconds=s.cooldown_seconds, fallback_replicas=s.fallback_replicas)


# (dataclass attribute, CRD field name, type) of spec.scaling.
_SCALING_FIELDS = (
    ("min_replicas", "minReplicas", int), ("max_replicas", "maxReplicas", int),
    ("tasks_per_replica", "tasksPerReplica", int), ("activation_tasks", "activationTasks", int),
    ("polling_interval_seconds", "pollingIntervalSeconds", int),
    ("scale_down_stabilization_seconds", "scaleDownStabilizationSeconds", int),
    ("cooldown_seconds", "cooldownSeconds", int), ("fallback_replicas", "fallbackReplicas", int),
    ("paused", "paused", bool), ("dry_run", "dryRun", bool),
)
