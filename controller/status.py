"""What a tick reports: the QueueWorker's status, its conditions and its Events.

Kept apart from the tick itself (reconcile.py), which observes, decides and acts: these functions
only turn what it found into the status fields (queueworker.scaling.resource names them, for the
console too), the KEP-1623 conditions and the Events, and keep an idle QueueWorker from costing an
API write per tick (`status_patch`). Every message is cut to MESSAGE_LIMIT characters.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from queueworker.scaling.policy import Decision, QueueDepth, Recommendation
from queueworker.scaling.resource import QueueDepthField, StatusField

from . import conditions
from .conditions import Condition, status_of
from .spec import QueueWorkerSpec

# Status messages and Event messages are cut to this many characters.
MESSAGE_LIMIT = 1000
# An unchanged status is still rewritten about this often (±10% per object, so QueueWorkers created
# together do not all write at once), to refresh lastPollTime.
STATUS_REFRESH_SECONDS = 600


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass
class TickResult:
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)


def failure(status: dict[str, Any], generation: int, reason: str, message: str, now: float) -> TickResult:
    """A tick that could not complete: only Ready changes (to False, for `reason`), the rest of the
    status is kept. A Warning Event only when the reason changed, not once per tick."""
    message = message[:MESSAGE_LIMIT]
    previous = [c for c in status.get(StatusField.CONDITIONS) or [] if c.get("type") != "Ready"]
    ready = Condition("Ready", "False", reason, message)
    kept = [Condition(c["type"], c["status"], c.get("reason", ""), c.get("message", "")) for c in previous
            if c.get("type") in conditions.TYPES]
    was = conditions.find(status.get(StatusField.CONDITIONS), "Ready") or {}
    return TickResult({StatusField.OBSERVED_GENERATION: generation, StatusField.REASON: reason,
                       StatusField.MESSAGE: message,
                       StatusField.CONDITIONS: conditions.render([ready, *kept], status.get(StatusField.CONDITIONS),
                                                                 generation, iso(now))},
                      [Event("Warning", reason, message)] if was.get("reason") != reason else [])


def tick_conditions(spec: QueueWorkerSpec, decision: Decision, error_reason: str | None, workload: dict[str, Any],
                    grace: int | None, drain: int | None, previous: list[dict[str, Any]] | None
                    ) -> tuple[list[Condition], list[Event]]:
    """Every condition after a tick that decided, and the Events their changes call for.
    `workload` is the scaled object (its ReplicaFailure condition), `grace` and `drain` its pods'
    grace period and the worker's drain when known."""
    ready = _ready_condition(error_reason, decision)
    replica_failure = _replica_failure(workload)
    events = (_ready_transition_events(conditions.find(previous, "Ready") or {}, ready)
              + _replica_failure_events(conditions.find(previous, "ReplicaFailure") or {}, replica_failure))
    return [ready, replica_failure, *_other_conditions(spec, decision, error_reason, grace, drain)], events


def depth_status(depth: QueueDepth) -> dict[str, Any]:
    """`status.queueDepth`; the throughput floor's inputs only when they were read, the keys' counts
    only for a queue with per-key limits."""
    shown: dict[str, Any] = {QueueDepthField.READY: depth.ready, QueueDepthField.RUNNING: depth.running,
                             QueueDepthField.RETRYING: depth.retrying, QueueDepthField.BLOCKED: depth.blocked,
                             QueueDepthField.DUE_SOON: depth.due_soon,
                             QueueDepthField.OLDEST_READY_AGE_SECONDS: round(depth.oldest_ready_age_seconds or 0.0, 3)}
    if depth.finish_rate is not None and depth.recent_task_seconds is not None:
        shown |= {QueueDepthField.FINISH_RATE: round(depth.finish_rate, 2),
                  QueueDepthField.RECENT_TASK_SECONDS: round(depth.recent_task_seconds, 3)}
    if depth.key_slots is not None:
        shown[QueueDepthField.KEY_SLOTS] = depth.key_slots
    if depth.key_limited:
        shown |= {QueueDepthField.KEYS_READY: depth.keys_ready, QueueDepthField.KEYS_HELD: depth.keys_held}
    if depth.connection_budget is not None:
        shown[QueueDepthField.CONNECTION_BUDGET] = depth.connection_budget
    return shown


def status_patch(previous: dict[str, Any], status: dict[str, Any], now: float, uid: str) -> dict[str, Any]:
    """Only what changed, so an idle QueueWorker costs no API write per tick; lastPollTime goes
    along with any change and at least about every STATUS_REFRESH_SECONDS (spread by the uid)."""
    patch = {k: v for k, v in status.items() if k != StatusField.LAST_POLL_TIME and previous.get(k) != v}
    last_poll = epoch(previous.get(StatusField.LAST_POLL_TIME))
    refresh = STATUS_REFRESH_SECONDS * (0.9 + 0.2 * (zlib.crc32(uid.encode()) % 1000) / 1000)
    if patch or last_poll is None or now - last_poll >= refresh:
        patch[StatusField.LAST_POLL_TIME] = status[StatusField.LAST_POLL_TIME]
    return patch


def recommendations(history: tuple[Recommendation, ...]) -> list[dict[str, Any]]:
    return [{"time": iso(r.time), "replicas": r.replicas} for r in history]


def history(status: dict[str, Any]) -> tuple[Recommendation, ...]:
    """The recommendations kept in the status (the scale-down window survives a restart)."""
    return tuple(Recommendation(epoch(r["time"]), int(r["replicas"]))  # type: ignore[arg-type]
                 for r in status.get(StatusField.RECOMMENDATIONS) or [] if r.get("time") and "replicas" in r)


def iso(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(epoch_seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def epoch(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _ready_condition(error_reason: str | None, decision: Decision) -> Condition:
    """The decision's message says it all: on errors it starts with why the queue was not read."""
    if error_reason:
        return Condition("Ready", "False", error_reason, decision.message[:MESSAGE_LIMIT])
    return Condition("Ready", "True", "QueueReadable", decision.message[:MESSAGE_LIMIT])


def _ready_transition_events(was: dict[str, Any], ready: Condition) -> list[Event]:
    """A Warning when Ready turns False (or its reason changes), a Normal `Recovered` when it turns True."""
    if (ready.status, ready.reason) == (was.get("status"), was.get("reason")):
        return []
    if ready.status == "False":
        return [Event("Warning", ready.reason, ready.message)]
    if was.get("status") == "False":
        return [Event("Normal", "Recovered", f"queue readable again; {ready.message}")]
    return []


def _replica_failure(deployment: dict[str, Any]) -> Condition:
    """The Deployment's own ReplicaFailure condition (copied from its ReplicaSet): True when pods
    cannot be created, e.g. refused by the namespace's Pod Security level or a quota."""
    failure = next((c for c in (deployment.get("status") or {}).get("conditions") or []
                    if c.get("type") == "ReplicaFailure" and c.get("status") == "True"), None)
    if failure is None:
        return Condition("ReplicaFailure", "False", "PodsCreated", "the worker pods can be created")
    return Condition("ReplicaFailure", "True", failure.get("reason") or "FailedCreate",
                     str(failure.get("message") or "the ReplicaSet cannot create pods")[:MESSAGE_LIMIT])


def _replica_failure_events(was: dict[str, Any], failure: Condition) -> list[Event]:
    """A Warning when pods stop being created (not on every tick while they cannot be)."""
    if failure.status == "True" and was.get("status") != "True":
        return [Event("Warning", failure.reason, failure.message)]
    return []


def _other_conditions(spec: QueueWorkerSpec, decision: Decision, error_reason: str | None,
                      grace: int | None, drain: int | None) -> list[Condition]:
    paused = spec.scaling.paused
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
        _limited(decision),
        _drain_safety(spec, grace, drain),
    ]


def _limited(decision: Decision) -> Condition:
    """Whether the queue's flow control or the database's connection budget bounds the replicas: a
    cap (LimitedByConcurrency, LimitedByRate, LimitedByKeys, LimitedByDatabase) or a hold (Paused,
    BreakerOpen, KeysHeld); Unknown while the depth cannot be read."""
    if decision.active is None:
        return Condition("Limited", "Unknown", "Unknown", "queue depth unknown")
    if decision.limit is None:
        return Condition("Limited", "False", "NotLimited", "the queue's limits allow what its tasks need")
    return Condition("Limited", "True", decision.limit.reason, decision.limit.why)


def _drain_safety(spec: QueueWorkerSpec, grace: int | None, drain: int | None) -> Condition:
    """Whether the pods' grace period outlasts the worker's drain (unknown for pods that are not
    recognisably our worker's: a scale target of another kind)."""
    if grace is None or drain is None:
        return Condition("DrainSafe", "Unknown", "NotAQueueworkerPod",
                         "the target's pods do not run `queueworker worker` with --drain-seconds")
    what = ("rollout.maxWaitSeconds" if spec.scale_target is None and spec.rollout.strategy == "WaitForIdle"
            else "drainSeconds" if spec.scale_target is None else "--drain-seconds")
    safe = grace > drain
    return Condition("DrainSafe", status_of(safe), "GracePeriodCoversDrain" if safe else "GracePeriodTooShort",
                     f"terminationGracePeriodSeconds={grace}, {what}={drain}" + (
                         "" if safe else
                         ": pods are killed before they finish draining; their tasks wait for the lease to expire"))
