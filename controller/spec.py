"""The QueueWorker spec as typed values, with the same defaults as the CRD schema.

The API server applies the schema defaults, so `from_dict` only fills them in for objects that
were stored before a default existed; tests/test_crd.py checks both agree. Where a spec field
becomes a worker flag (concurrency, leaseSeconds, drainSeconds), its default is the worker's own
(WorkerSettings): a QueueWorker that sets none runs `queueworker worker` as it runs without flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from queueworker.runtime.worker import CONNECTIONS_PER_WORKER
from queueworker.scaling.policy import ScalingParams
from queueworker.scaling.resource import GROUP
from queueworker.settings import WorkerSettings

_WORKER_DEFAULTS = WorkerSettings()
DEFAULT_CONCURRENCY = _WORKER_DEFAULTS.concurrency
DEFAULT_LEASE_SECONDS = int(_WORKER_DEFAULTS.lease_seconds)
DEFAULT_DRAIN_SECONDS = int(_WORKER_DEFAULTS.drain_seconds)
# Unlike a bare `queueworker worker` (no metrics unless asked), a QueueWorker's pods serve their
# metrics by default, on the port the pod annotations point Prometheus at.
DEFAULT_METRICS_PORT = 9100
DEFAULT_SECRET_KEY = "url"
DEFAULT_SCALE_TARGET_API_VERSION = "apps/v1"
# Time a worker needs after its drain to hand leases back and exit, added to the grace period.
SHUTDOWN_MARGIN_SECONDS = 10
# Kept free between the worker's shutdown budget and SIGKILL (process exit, the kubelet's own delay).
SHUTDOWN_HEADROOM_SECONDS = 2


class InvalidSpec(ValueError):
    """The spec cannot be used; the message says why and never carries a Secret value."""


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
    max_wait_seconds: int | None = None
    lookahead_seconds: int | None = None
    throughput_floor: bool = False


ROLLOUT_STRATEGIES = ("Drain", "WaitForIdle")


@dataclass(frozen=True)
class Rollout:
    """How pods that go away (a rollout of a new template, a scale-in) treat their running tasks.
    Drain: finish for `drainSeconds`, then hand the rest back. WaitForIdle: stop claiming and finish
    every running task, for up to `max_wait_seconds`; new pods come up before old ones stop."""

    strategy: str = "Drain"
    max_wait_seconds: int = 3600


# A scaleTargetRef's workload consents to being scaled by naming the QueueWorker here: whoever may
# create a QueueWorker must not be able to scale (or price the pods of) any workload of the namespace.
SCALED_BY_ANNOTATION = f"{GROUP}/scaled-by"


@dataclass(frozen=True)
class ScaleTarget:
    """`spec.scaleTargetRef`: a resource with a `scale` subresource, owned by someone else."""

    api_version: str
    kind: str
    name: str


@dataclass(frozen=True)
class QueueWorkerSpec:
    queue: str
    image: str | None  # None with a scale target: the pods are someone else's
    secret_name: str
    secret_key: str = DEFAULT_SECRET_KEY
    # spec.database.maxConnections: the most connections this QueueWorker's workers may hold (None: the
    # server's budget alone); the lower of it and the server's budget wins.
    max_connections: int | None = None
    handlers: str | None = None
    concurrency: int = DEFAULT_CONCURRENCY
    lease_seconds: int = DEFAULT_LEASE_SECONDS
    drain_seconds: int = DEFAULT_DRAIN_SECONDS
    metrics_port: int = DEFAULT_METRICS_PORT
    scaling: Scaling = field(default_factory=Scaling)
    template: dict[str, Any] = field(default_factory=dict)
    rollout: Rollout = field(default_factory=Rollout)
    scale_target: ScaleTarget | None = None

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> QueueWorkerSpec:
        """Raises InvalidSpec for a spec the schema should have refused (stored before a rule
        existed, or under a CRD installed without it)."""
        try:
            return cls._from_dict(spec)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidSpec(f"{type(exc).__name__}: {exc}") from exc

    @classmethod
    def _from_dict(cls, spec: dict[str, Any]) -> QueueWorkerSpec:
        secret_ref = spec["database"]["secretRef"]
        scaling = spec.get("scaling") or {}
        defaults = Scaling()
        template = spec.get("template") or {}
        if not isinstance(scaling, dict):
            raise TypeError("scaling must be an object")
        if not isinstance(template, dict) or not all(isinstance(template.get(part) or {}, dict)
                                                     for part in ("metadata", "spec")):
            raise TypeError("template, template.metadata and template.spec must be objects")
        template_grace_period(template)  # a non-numeric value is refused here, with the rest of the spec
        rollout = spec.get("rollout") or {}
        if not isinstance(rollout, dict):
            raise TypeError("rollout must be an object")
        strategy = str(rollout.get("strategy", Rollout.strategy))
        if strategy not in ROLLOUT_STRATEGIES:
            raise ValueError(f"rollout.strategy must be one of {', '.join(ROLLOUT_STRATEGIES)}, not {strategy[:40]!r}")
        ref = spec.get("scaleTargetRef")
        if ref is not None and not isinstance(ref, dict):
            raise TypeError("scaleTargetRef must be an object")
        if (ref is None) == (spec.get("image") is None):
            raise ValueError("give either image (a Deployment the QueueWorker owns) or scaleTargetRef, not both")
        return cls(
            queue=str(spec["queue"]), image=None if ref is not None else str(spec["image"]),
            secret_name=str(secret_ref["name"]),
            scale_target=None if ref is None else ScaleTarget(
                str(ref.get("apiVersion") or DEFAULT_SCALE_TARGET_API_VERSION), str(ref["kind"]), str(ref["name"])),
            secret_key=str(secret_ref.get("key", DEFAULT_SECRET_KEY)), handlers=spec.get("handlers") or None,
            max_connections=None if spec["database"].get("maxConnections") is None
            else int(spec["database"]["maxConnections"]),
            concurrency=int(spec.get("concurrency", DEFAULT_CONCURRENCY)),
            lease_seconds=int(spec.get("leaseSeconds", DEFAULT_LEASE_SECONDS)),
            drain_seconds=int(spec.get("drainSeconds", DEFAULT_DRAIN_SECONDS)),
            metrics_port=int(spec.get("metricsPort", DEFAULT_METRICS_PORT)),
            template=dict(template),
            rollout=Rollout(strategy, int(rollout.get("maxWaitSeconds", Rollout.max_wait_seconds))),
            scaling=Scaling(**{
                attr: (None if scaling.get(key) is None else type_(scaling[key])) if key in scaling
                else getattr(defaults, attr)
                for attr, key, type_ in _SCALING_FIELDS}),
        )

    @property
    def tasks_per_replica(self) -> int:
        return self.scaling.tasks_per_replica or self.concurrency

    @property
    def drain_budget_seconds(self) -> int:
        """How long a stopping worker lets its running tasks finish (`--drain-seconds`): drainSeconds,
        or with WaitForIdle rollout.maxWaitSeconds (a worker exits as soon as it holds no lease)."""
        return self.rollout.max_wait_seconds if self.rollout.strategy == "WaitForIdle" else self.drain_seconds

    @property
    def grace_period_seconds(self) -> int:
        """The pod's terminationGracePeriodSeconds: the template's when it sets one, else the drain
        budget plus SHUTDOWN_MARGIN_SECONDS. (The template's scalar replaces the generated one in the merge.)"""
        from_template = template_grace_period(self.template)
        return self.drain_budget_seconds + SHUTDOWN_MARGIN_SECONDS if from_template is None else from_template

    @property
    def shutdown_seconds(self) -> int:
        """The worker's whole SIGTERM-to-exit budget (`--shutdown-seconds`): the grace period less
        SHUTDOWN_HEADROOM_SECONDS, so drain, release, flush and deregister end before SIGKILL."""
        return max(1, self.grace_period_seconds - SHUTDOWN_HEADROOM_SECONDS)

    @property
    def initial_replicas(self) -> int:
        """What an owned Deployment is created with, before the first depth read: minReplicas, at most
        what maxConnections holds (one worker process a replica)."""
        if self.max_connections is None:
            return self.scaling.min_replicas
        return min(self.scaling.min_replicas, self.max_connections // CONNECTIONS_PER_WORKER)

    def scaling_params(self, worker_processes: int | None = None) -> ScalingParams:
        """The policy's knobs; with `worker_processes` (worker processes per replica), the connections a
        replica holds, which the database's budget is counted in."""
        s = self.scaling
        return ScalingParams(
            connections_per_replica=None if worker_processes is None else worker_processes * CONNECTIONS_PER_WORKER,
            min_replicas=s.min_replicas, max_replicas=s.max_replicas, tasks_per_replica=self.tasks_per_replica,
            activation_tasks=s.activation_tasks,
            scale_down_stabilization_seconds=s.scale_down_stabilization_seconds,
            cooldown_seconds=s.cooldown_seconds, fallback_replicas=s.fallback_replicas,
            max_wait_seconds=s.max_wait_seconds)


def template_grace_period(template: dict[str, Any]) -> int | None:
    """`template.spec.terminationGracePeriodSeconds`, if set; ValueError unless a whole number >= 0."""
    value = (template.get("spec") or {}).get("terminationGracePeriodSeconds")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"template.spec.terminationGracePeriodSeconds must be a whole number of seconds "
                         f"(at least 0), not {str(value)[:40]!r}")
    return value


# (dataclass attribute, CRD field name, type) of spec.scaling.
_SCALING_FIELDS = (
    ("min_replicas", "minReplicas", int), ("max_replicas", "maxReplicas", int),
    ("tasks_per_replica", "tasksPerReplica", int), ("activation_tasks", "activationTasks", int),
    ("polling_interval_seconds", "pollingIntervalSeconds", int),
    ("scale_down_stabilization_seconds", "scaleDownStabilizationSeconds", int),
    ("cooldown_seconds", "cooldownSeconds", int), ("fallback_replicas", "fallbackReplicas", int),
    ("paused", "paused", bool), ("dry_run", "dryRun", bool),
    ("max_wait_seconds", "maxWaitSeconds", int), ("lookahead_seconds", "lookaheadSeconds", int),
    ("throughput_floor", "throughputFloor", bool),
)
