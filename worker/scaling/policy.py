"""The scaling decision: a pure function from what the controller observed to a replica count.

Semantics follow KEDA and the HPA where the meaning is the same (activation is a strict `>`,
`cooldownSeconds` counts from the last active time and only gates N -> 0, a 10% tolerance, the
highest recommendation inside the scale-down window wins) and are safer where they are weak:
demand counts leased (running) tasks so busy workers are kept, 0 -> N goes straight to the target,
nothing scales down because the queue could not be read, and a deployment only goes to zero when
nothing is ready or running.

Times are plain float seconds (epoch), so the function is trivially table-tested.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..db.depth import QueueDepthRow

DEFAULT_TOLERANCE = 0.1


@dataclass(frozen=True)
class ScalingParams:
    """The `spec.scaling` knobs that drive a decision (tasks_per_replica already resolved)."""

    min_replicas: int = 0
    max_replicas: int = 10
    tasks_per_replica: int = 10
    activation_tasks: int = 0
    scale_down_stabilization_seconds: float = 300.0
    cooldown_seconds: float = 300.0
    fallback_replicas: int | None = None
    tolerance: float = DEFAULT_TOLERANCE
    # One more replica per tick (up to max) while the oldest ready task has waited longer than this.
    max_wait_seconds: float | None = None
    # Database connections one replica holds: its worker processes x CONNECTIONS_PER_WORKER
    # (queueworker.runtime.worker), as the controller knows them; None: the budget binds nothing.
    connections_per_replica: int | None = None

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class QueueDepth:
    """One queue's counts as read by `queueworker.db.depth.QUEUE_DEPTH` (ready may be capped)."""

    ready: int
    running: int
    retrying: int = 0
    oldest_ready_age_seconds: float | None = None
    blocked: int = 0  # waiting on prerequisites: reported, never scaled for
    # The queue's flow control (docs/flow-control.md): what the workers may start, whatever the backlog.
    paused: bool = False
    breaker_open: bool = False
    rate_per_second: float | None = None
    max_running: int | None = None
    mean_task_seconds: float | None = None  # of recent successes: what a rate limit keeps busy
    # Per-key limits (queueworker.key_capacity): the tasks the keys let run at once, over the keys the
    # least of their ready and running tasks, their cap and what their rate keeps busy, a held key
    # (paused, or behind a breaker in its cooldown) counting only its running tasks; None for a queue
    # without per-key limits, or when they bound nothing the read could see. `keys_ready`: the keys
    # with tasks ready; `keys_held`: those of them held. `key_limited`: the queue has per-key limits.
    key_limited: bool = False
    key_slots: int | None = None
    keys_ready: int = 0
    keys_held: int = 0
    # Waiting tasks (delayed, or retrying) due now or within the QueueWorker's lookaheadSeconds that
    # no worker's scheduler has admitted yet (none runs at zero replicas): counted as ready.
    due_soon: int = 0
    # The throughput floor's inputs (Little's law), when asked for: tasks finished per second
    # lately, and their mean duration.
    finish_rate: float | None = None
    recent_task_seconds: float | None = None
    # The database's connection budget as read with the depth: max_connections less the reserved
    # slots (`connection_limit`), the client backends of other roles; and, worked out by the
    # controller from those (queueworker_controller.queuedb), the connections this QueueWorker's
    # workers may hold: None when unknown.
    connection_limit: int | None = None
    other_role_connections: int = 0
    connection_budget: int | None = None

    @classmethod
    def from_row(cls, row: QueueDepthRow) -> QueueDepth:
        return cls(ready=int(row.ready), running=int(row.running), retrying=int(row.retrying),
                   oldest_ready_age_seconds=row.oldest_ready_age, blocked=int(row.blocked), paused=row.paused,
                   breaker_open=row.breaker_open, rate_per_second=row.rate_per_second, max_running=row.max_running,
                   mean_task_seconds=row.mean_task_seconds, due_soon=int(row.due_soon),
                   finish_rate=row.finish_rate, recent_task_seconds=row.recent_task_seconds,
                   connection_limit=int(row.connection_limit), other_role_connections=int(row.other_role_connections),
                   key_limited=row.key_limited, key_slots=None if row.key_slots is None else int(row.key_slots),
                   keys_ready=int(row.keys_ready), keys_held=int(row.keys_held))

    @property
    def demand(self) -> int:
        """Tasks that need a worker slot now or within the lookahead: waiting ones, those due soon,
        plus leased ones (so busy pods are kept)."""
        return self.ready + self.due_soon + self.running

    @property
    def every_ready_key_held(self) -> bool:
        """Tasks are ready, and every key they belong to is held: the backlog cannot start."""
        return self.ready > 0 and self.keys_ready > 0 and self.keys_held == self.keys_ready


@dataclass(frozen=True)
class Recommendation:
    time: float
    replicas: int


@dataclass(frozen=True)
class PolicyInputs:
    params: ScalingParams
    current_replicas: int
    depth: QueueDepth | None  # None: the queue could not be read this tick
    now: float
    history: tuple[Recommendation, ...] = ()
    last_active_time: float | None = None
    error: str | None = None  # why depth is None, for the message


@dataclass(frozen=True)
class Decision:
    desired_replicas: int
    reason: str  # CamelCase, for conditions, Events and metrics
    message: str  # one human sentence explaining the number
    history: tuple[Recommendation, ...] = field(default=())
    active: bool | None = None  # None when unknown (queue unreadable)
    last_active_time: float | None = None
    fallback: bool = False
    # What of the queue's flow control bounded this decision (a cap, or a hold), if anything: the
    # QueueWorker's `Limited` condition.
    limit: FlowLimit | None = None


def decide(inputs: PolicyInputs) -> Decision:
    """Desired replicas for one tick, with the reason and the recommendation history to keep."""
    p, current = inputs.params, inputs.current_replicas
    if inputs.depth is None:
        return _decide_without_depth(inputs)
    depth = inputs.depth
    active = depth.demand > p.activation_tasks
    last_active = inputs.now if active else inputs.last_active_time
    counts = f"{depth.demand} tasks ({depth.ready} ready, " + (
        f"{depth.due_soon} due soon, " if depth.due_soon else "") + f"{depth.running} running)"
    floor = max(p.min_replicas, 1)  # zero is only reached through the cooldown rule below
    history = _window(inputs.history, inputs.now, p.scale_down_stabilization_seconds, floor)

    capped: FlowLimit | None = None  # set once a flow limit lowered the target
    budget = database_limit(depth, p.connections_per_replica)

    def decision(desired: int, reason: str, message: str) -> Decision:
        limit = capped
        if budget is not None and desired > max(current, budget.replicas):
            # No rule scales past the database's budget, minReplicas included: workers that cannot
            # connect start nothing and take the connections other clients need. Nor does the
            # budget take replicas away: those running hold their connections already.
            desired, limit = max(current, budget.replicas), budget
            reason, message = budget.reason, f"{message}; capped at {desired} by {budget.why}"
        elif limit is not None and reason in ("Activated", "ScaledUp", "Steady", "WithinTolerance", *RAISED_BY):
            reason, message = limit.reason, f"{message}; capped by {limit.why}"
        recorded = _remember(history, Recommendation(inputs.now, desired), floor)
        return Decision(desired, reason, message, recorded, active, last_active, limit=limit)

    if depth.paused or depth.breaker_open or depth.every_ready_key_held:
        held = p.clamp(current)
        reason, what = (("Paused", "paused") if depth.paused
                        else ("BreakerOpen", "behind an open circuit breaker") if depth.breaker_open
                        else ("KeysHeld", f"held key by key (its {depth.keys_held} keys with tasks ready are "
                                          "paused or behind an open breaker)"))
        message = f"queue {what}: {depth.ready} ready tasks cannot start; holding {held} replicas"
        capped = FlowLimit(held, reason, message)
        return decision(held, reason, message)

    if current == 0 and not active:
        if p.min_replicas == 0:
            return decision(0, "Idle", f"{counts}, not above activationTasks={p.activation_tasks}: staying at 0")
        return decision(p.min_replicas, "ClampedToBounds", f"0 replicas: raised to minReplicas={p.min_replicas}")

    if depth.demand == 0 and p.min_replicas == 0 and not active:
        idle_for = None if last_active is None else inputs.now - last_active
        if idle_for is None or idle_for >= p.cooldown_seconds:
            return decision(0, "ScaledToZero", f"nothing ready or running for "
                            f"{'ever' if idle_for is None else f'{idle_for:.0f}s'} "
                            f"(cooldownSeconds={p.cooldown_seconds:g}): scaling to zero")

    raised = _raise_target(p, depth, current, max(floor, min(p.max_replicas,
                                                               math.ceil(depth.demand / p.tasks_per_replica))))
    target = raised.replicas
    per = f"{p.tasks_per_replica} per replica"
    limit = flow_limit(depth, p.tasks_per_replica)
    if limit is not None and target > max(floor, limit.replicas):
        target, capped = max(floor, limit.replicas), limit
    if budget is not None and target > max(current, budget.replicas):  # below minReplicas too: see decision()
        target, capped = max(current, budget.replicas), budget
    why = f" ({raised.why})" if raised.reason and target == raised.replicas else ""
    # Counts wobble, and the tolerance absorbs that; a throughput floor or a wait limit is a decision.
    deliberate = bool(why) and raised.reason in ("ThroughputFloor", "WaitTooLong")

    if current == 0:  # a scheduled burst starts its pods before it is due: said so
        return decision(target, "DueSoon" if why and raised.reason == "DueSoon" else "Activated",
                        f"{counts} > activationTasks={p.activation_tasks}: "
                        f"0 -> {target} replicas in one step ({per}){why}")
    if current < p.min_replicas or current > p.max_replicas:
        clamped = p.clamp(current)
        return decision(clamped, "ClampedToBounds", f"{current} replicas outside "
                        f"[{p.min_replicas}, {p.max_replicas}]: set to {clamped}")
    ratio = depth.demand / (p.tasks_per_replica * current)
    if target != current and abs(ratio - 1.0) <= p.tolerance and not deliberate:
        return decision(current, "WithinTolerance", f"{counts} is within {p.tolerance:.0%} of {current} "
                        f"replicas x {p.tasks_per_replica}: holding {current}")
    if target > current:
        return decision(target, raised.reason if why else "ScaledUp",
                        f"{counts}, {per}: {current} -> {target} replicas{why}"
                        + (" (maxReplicas)" if target == p.max_replicas else ""))
    if target == current:
        return decision(current, raised.reason if why else "Steady", f"{counts}, {per}: {current} replicas{why}")
    recorded = _remember(history, Recommendation(inputs.now, target), floor)
    stabilized = min(current, max((r.replicas for r in recorded), default=target))
    if stabilized < current:
        return Decision(stabilized, "ScaledDown", f"{counts}, {per}: {current} -> {stabilized} replicas "
                        f"(highest in the last {p.scale_down_stabilization_seconds:g}s)",
                        recorded, active, last_active, limit=capped)
    return Decision(current, "Stabilizing", f"{counts} needs {target} replicas; holding {current} for the "
                    f"{p.scale_down_stabilization_seconds:g}s scale-down window", recorded, active, last_active,
                    limit=capped)


# Reasons of a target raised above what the count alone asks for (see _raise_target).
RAISED_BY = ("DueSoon", "ThroughputFloor", "WaitTooLong")


@dataclass(frozen=True)
class RaisedTarget:
    replicas: int
    reason: str | None  # one of RAISED_BY, or None: the count alone
    why: str


def _raise_target(p: ScalingParams, depth: QueueDepth, current: int, target: int) -> RaisedTarget:
    """The count's target (`target`, lookahead included), raised when the queue needs more than its
    count says, in stages:

    - DueSoon: the tasks due within the lookahead are what lifted the count's target;
    - ThroughputFloor: the slots a steady flow keeps busy (Little's law: finish rate x mean task
      duration, over the recent window), so a high rate with a short backlog keeps its pods;
    - WaitTooLong: the oldest ready task has waited past maxWaitSeconds: one more replica than now
      (per tick, up to maxReplicas), even when the count alone says no.
    """
    raised = RaisedTarget(target, None, "")
    if depth.due_soon:
        without = max(1, math.ceil((depth.ready + depth.running) / p.tasks_per_replica))
        if target > without:
            raised = RaisedTarget(target, "DueSoon", f"{depth.due_soon} due within the lookahead")
    busy = throughput_slots(depth)
    if busy is not None:
        floor = min(p.max_replicas, math.ceil(busy / p.tasks_per_replica))
        if floor > raised.replicas:
            raised = RaisedTarget(floor, "ThroughputFloor", f"{depth.finish_rate:.1f} tasks/s x "
                                  f"{depth.recent_task_seconds:.2f}s each keep {busy} slots busy")
    waited = depth.oldest_ready_age_seconds
    if (p.max_wait_seconds is not None and waited is not None and waited > p.max_wait_seconds
            and depth.ready > 0 and raised.replicas <= current < p.max_replicas):
        raised = RaisedTarget(current + 1, "WaitTooLong", f"the oldest ready task has waited {waited:.0f}s, "
                              f"over maxWaitSeconds={p.max_wait_seconds:g}")
    return raised


def throughput_slots(depth: QueueDepth) -> int | None:
    """Slots a steady flow keeps busy: finish rate x mean duration, rounded up (None: not measured)."""
    if depth.finish_rate is None or depth.recent_task_seconds is None:
        return None
    return math.ceil(depth.finish_rate * depth.recent_task_seconds)


@dataclass(frozen=True)
class FlowLimit:
    replicas: int
    # LimitedByConcurrency, LimitedByRate, LimitedByKeys or LimitedByDatabase; for a hold Paused,
    # BreakerOpen, KeysHeld
    reason: str
    why: str


def database_limit(depth: QueueDepth, connections_per_replica: int | None) -> FlowLimit | None:
    """The most replicas the database's connection budget for this QueueWorker's workers holds:
    budget // connections per replica (None: budget unknown). The budget leaves out the connections
    of the workers running now (they are this login's role's, which it does not subtract), so the
    replicas already running never shrink it: only other clients taking connections do."""
    if depth.connection_budget is None or connections_per_replica is None:
        return None
    replicas = max(0, depth.connection_budget) // max(1, connections_per_replica)
    return FlowLimit(replicas, "LimitedByDatabase", f"the database's budget of {depth.connection_budget} "
                     f"connections for these workers, {connections_per_replica} per replica")


def flow_limit(depth: QueueDepth, tasks_per_replica: int) -> FlowLimit | None:
    """The most replicas the queue's limits can keep busy: a global cap of N running tasks needs
    N / tasks_per_replica of them; a rate of R tasks/s whose tasks take D seconds keeps R x D slots
    busy (Little's law). Before any task of a rate-limited queue has finished, D is unknown: one
    replica, until it is. Per-key limits: the slots the keys can fill, key by key. The lowest wins."""
    limits = []
    if depth.key_slots is not None:
        limits.append(FlowLimit(math.ceil(depth.key_slots / tasks_per_replica), "LimitedByKeys",
                                f"its keys can run {depth.key_slots} tasks at once"))
    if depth.max_running is not None:
        limits.append(FlowLimit(math.ceil(depth.max_running / tasks_per_replica), "LimitedByConcurrency",
                                f"at most {depth.max_running} running across all workers"))
    if depth.rate_per_second is not None:
        if depth.mean_task_seconds is None:
            limits.append(FlowLimit(1, "LimitedByRate", f"a rate of {depth.rate_per_second:g}/s, task "
                                    "durations not known yet"))
        else:
            slots = max(1, math.ceil(depth.rate_per_second * depth.mean_task_seconds))
            limits.append(FlowLimit(math.ceil(slots / tasks_per_replica), "LimitedByRate",
                                    f"a rate of {depth.rate_per_second:g}/s x {depth.mean_task_seconds:.2f}s "
                                    f"per task = {slots} busy slots"))
    return min(limits, key=lambda limit: limit.replicas, default=None)


def _decide_without_depth(inputs: PolicyInputs) -> Decision:
    """The queue could not be read: never scale down because of it; apply fallbackReplicas if higher."""
    p, current = inputs.params, inputs.current_replicas
    history = _window(inputs.history, inputs.now, p.scale_down_stabilization_seconds, max(p.min_replicas, 1))
    why = inputs.error or "queue depth unavailable"
    if p.fallback_replicas is not None and p.fallback_replicas > current:
        desired = p.clamp(p.fallback_replicas)
        return Decision(desired, "FallbackApplied", f"{why}: applying fallbackReplicas={desired}",
                        history, None, inputs.last_active_time, fallback=True)
    desired = p.clamp(current)
    return Decision(desired, "HoldingOnError", f"{why}: holding {desired} replicas", history, None,
                    inputs.last_active_time, fallback=p.fallback_replicas is not None)


def _window(history: tuple[Recommendation, ...], now: float, seconds: float, floor: int
            ) -> tuple[Recommendation, ...]:
    """The recommendations still inside the window, compacted."""
    kept: tuple[Recommendation, ...] = ()
    for r in history:
        if now - r.time <= seconds:
            kept = _remember(kept, r, floor)
    return kept


def _remember(history: tuple[Recommendation, ...], latest: Recommendation, floor: int
              ) -> tuple[Recommendation, ...]:
    """Appends `latest` and drops entries a later, higher-or-equal one dominates, so the window's
    maximum is unchanged and the history stays a short, strictly decreasing list. Entries at or below
    `floor` (the lowest non-zero target) are not kept: they can never raise a scale-down, and a steady
    or idle QueueWorker then has an unchanging history (no status write per tick)."""
    kept = [r for r in history if r.replicas > latest.replicas]
    return (*kept, latest) if latest.replicas > floor else tuple(kept)
