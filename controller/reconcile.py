"""One scaling tick of one QueueWorker: observe, decide, act, report.

Kept free of kopf: the operator hands in the object's fields and gets back a status patch and the
Events to post. Blocking Kubernetes and database calls run in threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import psycopg
from kubernetes.client.rest import ApiException

from . import conditions, metrics
from .conditions import Condition, status_of
from .deployment import HASH_ANNOTATION, build_deployment, deployment_name, grace_period_seconds, selector_labels
from .kube import DELETION_COST_ANNOTATION, Kube, SecretUnavailable
from .policy import Decision, PolicyInputs, QueueDepth, Recommendation, decide
from .queuedb import QueueDatabases
from .scalein import deletion_costs
from .spec import QueueWorkerSpec

log = logging.getLogger(__name__)


# A NOTIFY for the queue makes a tick due early, but not more often than this.
MIN_NOTIFIED_POLL_SECONDS = 1.0
# An unchanged status is still rewritten this often, to refresh lastPollTime.
STATUS_REFRESH_SECONDS = 60


@dataclass
class ObjectMemory:
    """What the controller remembers about one QueueWorker between ticks (lost on restart, harmless)."""

    generation: int | None = None
    last_poll: float = float("-inf")  # monotonic
    next_poll: float = 0.0  # monotonic
    listening_on: tuple[str, str] | None = None  # (dsn, queue) once the Secret was read


class DeploymentNotOwned(Exception):
    """A Deployment with the worker Deployment's name belongs to someone else."""


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass
class TickResult:
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)


@dataclass(frozen=True)
class QueueWorkerObject:
    name: str
    namespace: str
    uid: str
    generation: int
    spec: dict[str, Any]
    status: dict[str, Any]


class Reconciler:
    def __init__(self, kube: Kube, databases: QueueDatabases, wall_clock=time.time, monotonic=time.monotonic):
        self.kube = kube
        self.databases = databases
        self.wall_clock = wall_clock
        self.monotonic = monotonic

    def due(self, obj: QueueWorkerObject, memory: ObjectMemory) -> bool:
        """A tick is due when the polling interval has passed, the spec changed, or tasks were
        enqueued on the queue since the last poll (at most once per MIN_NOTIFIED_POLL_SECONDS)."""
        now = self.monotonic()
        if obj.generation != memory.generation or now >= memory.next_poll:
            return True
        return (memory.listening_on is not None and now - memory.last_poll >= MIN_NOTIFIED_POLL_SECONDS
                and self.databases.notified_since(*memory.listening_on, memory.last_poll))

    async def tick(self, obj: QueueWorkerObject, memory: ObjectMemory) -> TickResult:
        started = self.monotonic()
        try:
            spec = QueueWorkerSpec.from_dict(obj.spec)
        except (KeyError, TypeError, ValueError) as exc:
            memory.generation = obj.generation
            memory.next_poll = started + 60
            return self._failed(obj, "InvalidSpec", f"spec cannot be used: {exc!r}")
        memory.generation = obj.generation
        memory.last_poll = started
        memory.next_poll = started + spec.scaling.polling_interval_seconds
        try:
            return await self._tick(obj, spec, memory)
        finally:
            metrics.tick_seconds.observe(self.monotonic() - started)

    async def _tick(self, obj: QueueWorkerObject, spec: QueueWorkerSpec, memory: ObjectMemory) -> TickResult:
        now = self.wall_clock()
        rendered = build_deployment(obj.name, obj.namespace, obj.uid, spec)
        try:
            deployment = await asyncio.to_thread(self._ensure_deployment, rendered, spec, obj.uid)
        except ApiException as exc:
            return self._failed(obj, "DeploymentError", f"worker Deployment: {exc.status} {exc.reason}")
        except DeploymentNotOwned as exc:
            return self._failed(obj, "DeploymentNotOwned", str(exc))
        current = int(deployment["spec"].get("replicas", 1))
        ready_replicas = int(deployment.get("status", {}).get("readyReplicas") or 0)

        dsn, depth, error_reason, error = await self._read_depth(obj.namespace, spec, memory)
        if error_reason:
            metrics.errors.labels(obj.namespace, obj.name, error_reason).inc()
        previous = obj.status
        decision = decide(PolicyInputs(
            spec.scaling_params(), current, depth, now, _history(previous), _epoch(previous.get("lastActiveTime")),
            error))
        events: list[Event] = []
        desired = current if spec.scaling.paused else decision.desired_replicas
        replicas, last_scale = current, previous.get("lastScaleTime")
        if desired != current and not spec.scaling.paused and not spec.scaling.dry_run:
            try:
                if desired < current and dsn is not None:
                    await self._price_pods(obj.namespace, obj.name, spec, dsn)
                await asyncio.to_thread(self.kube.scale_deployment, obj.namespace, deployment_name(obj.name), desired)
            except ApiException as exc:
                return self._failed(obj, "ScaleFailed", f"scaling {current} -> {desired}: {exc.status} {exc.reason}")
            replicas, last_scale = desired, _iso(now)
            metrics.scales.labels(obj.namespace, obj.name, "up" if desired > current else "down").inc()
            events.append(Event("Normal", decision.reason, decision.message))
            log.info("%s/%s: %s: %s", obj.namespace, obj.name, decision.reason, decision.message)
        elif desired != current and spec.scaling.dry_run and desired != previous.get("desiredReplicas"):
            events.append(Event("Normal", "DryRun", f"would scale: {decision.message}"))

        ready = _ready_condition(error_reason, error, decision)
        events += _ready_transition_events(conditions.find(previous.get("conditions"), "Ready") or {}, ready)
        new_conditions = [ready, *_other_conditions(spec, decision, error_reason, grace_period_seconds(rendered))]
        status: dict[str, Any] = {
            "observedGeneration": obj.generation,
            "deployment": deployment_name(obj.name),
            "replicas": replicas,
            "desiredReplicas": desired,
            "readyReplicas": ready_replicas,
            "tasksPerReplica": spec.tasks_per_replica,
            "lastPollTime": _iso(now),
            "lastScaleTime": last_scale,
            "lastActiveTime": _iso(decision.last_active_time) if decision.last_active_time else None,
            "reason": "Paused" if spec.scaling.paused else decision.reason,
            "message": decision.message,
            "recommendations": [{"time": _iso(r.time), "replicas": r.replicas} for r in decision.history],
            "conditions": conditions.render(new_conditions, previous.get("conditions"), obj.generation, _iso(now)),
        }
        if depth is not None:
            status["queueDepth"] = {"ready": depth.ready, "running": depth.running, "retrying": depth.retrying,
                                    "oldestReadyAgeSeconds": round(depth.oldest_ready_age_seconds or 0.0, 3)}
        _export(obj, decision, desired, replicas, depth)
        return TickResult(_status_patch(previous, status, now), events)

    def _ensure_deployment(self, rendered: dict[str, Any], spec: QueueWorkerSpec, uid: str) -> dict[str, Any]:
        """The worker Deployment, created (at minReplicas) or updated when its rendering changed.
        A same-named Deployment this QueueWorker does not control is left alone."""
        meta = rendered["metadata"]
        current = self.kube.read_deployment(meta["namespace"], meta["name"])
        if current is None:
            return self.kube.create_deployment(meta["namespace"], rendered, spec.scaling.min_replicas)
        if not any(ref.get("uid") == uid and ref.get("controller")
                   for ref in current["metadata"].get("ownerReferences") or []):
            raise DeploymentNotOwned(f"Deployment {meta['namespace']}/{meta['name']} exists and is not controlled "
                                     f"by this QueueWorker; rename or delete it")
        if (current["metadata"].get("annotations") or {}).get(HASH_ANNOTATION) != meta["annotations"][HASH_ANNOTATION]:
            return self.kube.update_deployment(current, rendered)
        return current

    async def _read_depth(self, namespace: str, spec: QueueWorkerSpec, memory: ObjectMemory
                          ) -> tuple[str | None, QueueDepth | None, str | None, str | None]:
        """(dsn, depth, error reason, error message); depth is None when it could not be read."""
        try:
            dsn = await asyncio.to_thread(self.kube.read_secret_value, namespace, spec.secret_name, spec.secret_key)
        except SecretUnavailable as exc:
            return None, None, "SecretUnavailable", str(exc)
        except ApiException as exc:
            return None, None, "SecretUnavailable", f"Secret {namespace}/{spec.secret_name}: {exc.status} {exc.reason}"
        self.databases.listen(dsn)
        memory.listening_on = (dsn, spec.queue)
        # Enough to ask for maxReplicas, and to see that there is more than that.
        cap = spec.scaling.max_replicas * spec.tasks_per_replica + 1
        try:
            return dsn, await self.databases.depth(dsn, spec.queue, cap), None, None
        except psycopg.Error as exc:
            return dsn, None, "DatabaseUnreachable", f"cannot read queue {spec.queue!r}: {_first_line(exc)}"

    async def _price_pods(self, namespace: str, name: str, spec: QueueWorkerSpec, dsn: str) -> None:
        """Best effort: a failure here must not block the scale-down, only make its victims random."""
        try:
            leases = await self.databases.worker_leases(dsn, namespace, spec.queue)
            pods = await asyncio.to_thread(self.kube.list_pods, namespace, selector_labels(name))
            costs = deletion_costs([p["metadata"]["name"] for p in pods], leases)
            for pod in pods:
                meta = pod["metadata"]
                cost = str(costs[meta["name"]])
                if (meta.get("annotations") or {}).get(DELETION_COST_ANNOTATION) != cost:
                    await asyncio.to_thread(self.kube.set_deletion_cost, namespace, meta["name"], int(cost))
        except (ApiException, psycopg.Error) as exc:
            log.warning("could not set pod deletion costs for %s/%s: %s", namespace, name, exc)

    def _failed(self, obj: QueueWorkerObject, reason: str, message: str) -> TickResult:
        """A tick that could not complete: only Ready changes, the rest of the status is kept."""
        metrics.errors.labels(obj.namespace, obj.name, reason).inc()
        now = _iso(self.wall_clock())
        previous = [c for c in obj.status.get("conditions") or [] if c.get("type") != "Ready"]
        ready = Condition("Ready", "False", reason, message)
        kept = [Condition(c["type"], c["status"], c.get("reason", ""), c.get("message", "")) for c in previous
                if c.get("type") in conditions.TYPES]
        was = conditions.find(obj.status.get("conditions"), "Ready") or {}
        events = [] if was.get("reason") == reason else [Event("Warning", reason, message)]
        return TickResult({"observedGeneration": obj.generation, "reason": reason, "message": message,
                           "conditions": conditions.render([ready, *kept], obj.status.get("conditions"),
                                                           obj.generation, now)}, events)


def _status_patch(previous: dict[str, Any], status: dict[str, Any], now: float) -> dict[str, Any]:
    """Only what changed, so an idle QueueWorker costs no API write per tick; lastPollTime goes
    along with any change and at least every STATUS_REFRESH_SECONDS."""
    patch = {k: v for k, v in status.items() if k != "lastPollTime" and previous.get(k) != v}
    last_poll = _epoch(previous.get("lastPollTime"))
    if patch or last_poll is None or now - last_poll >= STATUS_REFRESH_SECONDS:
        patch["lastPollTime"] = status["lastPollTime"]
    return patch


def _ready_condition(error_reason: str | None, error: str | None, decision: Decision) -> Condition:
    if error_reason:
        return Condition("Ready", "False", error_reason, f"{error}; {decision.message}")
    return Condition("Ready", "True", "QueueReadable", decision.message)


def _ready_transition_events(was: dict[str, Any], ready: Condition) -> list[Event]:
    """A Warning when Ready turns False (or its reason changes), a Normal `Recovered` when it turns True."""
    if (ready.status, ready.reason) == (was.get("status"), was.get("reason")):
        return []
    if ready.status == "False":
        return [Event("Warning", ready.reason, ready.message)]
    if was.get("status") == "False":
        return [Event("Normal", "Recovered", f"queue readable again; {ready.message}")]
    return []


def _other_conditions(spec: QueueWorkerSpec, decision: Decision, error_reason: str | None,
                      grace: int) -> list[Condition]:
    paused, drain_safe = spec.scaling.paused, grace > spec.drain_seconds
    return [
        Condition("Active", status_of(decision.active), *(
            (error_reason or "Unknown", "queue depth unknown") if decision.active is None else
            ("QueueActive", "ready + running is above activationTasks") if decision.active else
            ("QueueIdle", "ready + running is not above activationTasks"))),
        Condition("Paused", status_of(paused), "Paused" if paused else "Scaling",
                  "scaling.paused is true: replicas are left alone" if paused else
                  "replicas follow the queue" + (" (dryRun: not applied)" if spec.scaling.dry_run else "")),
        Condition("Fallback", status_of(decision.fallback), "FallbackActive" if decision.fallback else "NoFallback",
                  decision.message if decision.fallback else "the queue depth is being read"),
        Condition("DrainSafe", status_of(drain_safe),
                  "GracePeriodCoversDrain" if drain_safe else "GracePeriodTooShort",
                  f"terminationGracePeriodSeconds={grace}, drainSeconds={spec.drain_seconds}" + (
                      "" if drain_safe else
                      ": pods are killed before they finish draining; their tasks wait for the lease to expire")),
    ]


def _export(obj: QueueWorkerObject, decision: Decision, desired: int, replicas: int, depth: QueueDepth | None) -> None:
    labels = (obj.namespace, obj.name)
    metrics.decisions.labels(*labels, decision.reason).inc()
    metrics.desired_replicas.labels(*labels).set(desired)
    metrics.replicas.labels(*labels).set(replicas)
    if depth is not None:
        for state in ("ready", "running", "retrying"):
            metrics.queue_depth.labels(*labels, state).set(getattr(depth, state))


def _history(status: dict[str, Any]) -> tuple[Recommendation, ...]:
    return tuple(Recommendation(_epoch(r["time"]), int(r["replicas"]))  # type: ignore[arg-type]
                 for r in status.get("recommendations") or [] if r.get("time") and "replicas" in r)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
