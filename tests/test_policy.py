"""The scaling policy: a table of cases, then properties over random inputs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueworker.scaling.policy import (
    Decision, PolicyInputs, QueueDepth, Recommendation, ScalingParams, decide,
)

NOW = 10_000.0
DB = ScalingParams(max_replicas=10, tasks_per_replica=10, connections_per_replica=6)
P = ScalingParams(min_replicas=0, max_replicas=10, tasks_per_replica=5, activation_tasks=0,
                  scale_down_stabilization_seconds=60, cooldown_seconds=120)


def run(current: int, ready: int | None, running: int = 0, *, params: ScalingParams = P,
        history: tuple[tuple[float, int], ...] = (), last_active: float | None = NOW,
        error: str | None = None, flow: dict | None = None, depth: dict | None = None) -> Decision:
    """`flow` and `depth`: more QueueDepth fields (flow control; lookahead, throughput, wait)."""
    depth = None if ready is None else QueueDepth(ready=ready, running=running, **(flow or {}), **(depth or {}))
    return decide(PolicyInputs(params, current, depth, NOW,
                               tuple(Recommendation(NOW - age, n) for age, n in history), last_active, error))


CASES = [
    # id, current, ready, running, extra kwargs, expected replicas, expected reason
    ("idle-at-zero", 0, 0, 0, {}, 0, "Idle"),
    ("activation-is-strict", 0, 3, 0, {"params": ScalingParams(activation_tasks=3)}, 0, "Idle"),
    ("activation-one-step", 0, 200, 0, {}, 10, "Activated"),
    ("activation-exact-target", 0, 12, 0, {}, 3, "Activated"),
    ("activation-beats-scaling", 0, 40, 0, {"params": ScalingParams(tasks_per_replica=10, activation_tasks=50)},
     0, "Idle"),
    ("running-counts-as-demand", 1, 0, 15, {}, 3, "ScaledUp"),
    ("scale-up-one-step-capped", 2, 500, 0, {}, 10, "ScaledUp"),
    ("steady", 3, 10, 5, {}, 3, "Steady"),
    ("within-tolerance-up", 10, 52, 0, {"params": ScalingParams(max_replicas=20, tasks_per_replica=5)},
     10, "WithinTolerance"),
    ("within-tolerance-down", 10, 45, 0, {"params": ScalingParams(max_replicas=20, tasks_per_replica=5)},
     10, "WithinTolerance"),
    ("outside-tolerance-up", 10, 56, 0, {"params": ScalingParams(max_replicas=20, tasks_per_replica=5)},
     12, "ScaledUp"),
    ("scale-down-waits-for-window", 5, 5, 0, {"history": ((30, 5),)}, 5, "Stabilizing"),
    ("scale-down-highest-in-window", 5, 5, 0, {"history": ((90, 5), (30, 3))}, 3, "ScaledDown"),
    ("scale-down-after-window", 5, 5, 0, {"history": ((61, 5),)}, 1, "ScaledDown"),
    ("no-zero-before-cooldown", 1, 0, 0, {"last_active": NOW - 60}, 1, "Steady"),
    ("zero-after-cooldown", 3, 0, 0, {"last_active": NOW - 120, "history": ((10, 3),)}, 0, "ScaledToZero"),
    ("no-zero-while-running", 1, 0, 1, {"last_active": NOW - 999, "params": ScalingParams(activation_tasks=5)},
     1, "Steady"),
    ("min-replicas-floor", 0, 0, 0, {"params": ScalingParams(min_replicas=2)}, 2, "ClampedToBounds"),
    ("min-replicas-no-zero", 4, 0, 0, {"params": ScalingParams(min_replicas=2, scale_down_stabilization_seconds=0),
                                       "last_active": None}, 2, "ScaledDown"),
    ("above-max-after-spec-change", 15, 500, 0, {}, 10, "ClampedToBounds"),
    ("error-holds", 4, None, 0, {"error": "connection refused"}, 4, "HoldingOnError"),
    ("error-never-zero", 4, None, 0, {"last_active": NOW - 9999}, 4, "HoldingOnError"),
    ("error-fallback-raises", 1, None, 0, {"params": ScalingParams(fallback_replicas=3)}, 3, "FallbackApplied"),
    ("error-fallback-never-lowers", 6, None, 0, {"params": ScalingParams(fallback_replicas=3)}, 6,
     "HoldingOnError"),
    # flow control: work that cannot start is not scaled for; limits cap what is
    ("paused-backlog-holds", 2, 500, 0, {"flow": {"paused": True}}, 2, "Paused"),
    ("paused-at-zero-stays", 0, 500, 0, {"flow": {"paused": True}}, 0, "Paused"),
    ("paused-never-scales-down", 4, 500, 0, {"flow": {"paused": True}, "last_active": NOW - 9999}, 4, "Paused"),
    ("breaker-open-holds", 1, 500, 0, {"flow": {"breaker_open": True}}, 1, "BreakerOpen"),
    ("concurrency-caps", 1, 500, 0, {"flow": {"max_running": 12}}, 3, "LimitedByConcurrency"),
    ("concurrency-caps-activation", 0, 500, 0, {"flow": {"max_running": 3}}, 1, "LimitedByConcurrency"),
    ("rate-caps-by-littles-law", 1, 500, 0, {"flow": {"rate_per_second": 10, "mean_task_seconds": 2.0}}, 4,
     "LimitedByRate"),
    ("rate-unknown-durations-one", 0, 500, 0, {"flow": {"rate_per_second": 10}}, 1, "LimitedByRate"),
    ("lower-limit-wins", 1, 500, 0, {"flow": {"rate_per_second": 10, "mean_task_seconds": 2.0,
                                              "max_running": 5}}, 1, "LimitedByConcurrency"),
    ("keys-cap", 1, 500, 0, {"flow": {"key_slots": 12}}, 3, "LimitedByKeys"),
    ("keys-cap-below-queue-cap", 1, 500, 0, {"flow": {"key_slots": 6, "max_running": 40}}, 2, "LimitedByKeys"),
    ("keys-all-held-holds", 2, 500, 0, {"flow": {"keys_ready": 3, "keys_held": 3, "key_slots": 0}}, 2, "KeysHeld"),
    ("keys-some-held-caps", 1, 500, 0, {"flow": {"keys_ready": 3, "keys_held": 2, "key_slots": 4}}, 1,
     "LimitedByKeys"),
    ("keys-held-nothing-ready-scales-down", 4, 0, 0, {"flow": {"keys_ready": 0, "keys_held": 0, "key_slots": 0},
                                                     "history": ((61, 4),)}, 1, "ScaledDown"),
    ("keys-unbounded-is-silent", 1, 500, 0, {"flow": {"keys_ready": 50, "key_slots": None}}, 10, "ScaledUp"),
    ("limit-above-demand-is-silent", 1, 7, 0, {"flow": {"max_running": 100}}, 2, "ScaledUp"),
    ("limit-never-blocks-scale-down", 8, 5, 0, {"flow": {"max_running": 10}, "history": ((61, 8),)}, 1,
     "ScaledDown"),
    # the database's connection budget: 6 connections a replica (one worker process), minReplicas included
    ("database-caps-scale-up", 1, 500, 0, {"params": DB, "depth": {"connection_budget": 20}}, 3, "LimitedByDatabase"),
    ("database-caps-activation", 0, 500, 0, {"params": DB, "depth": {"connection_budget": 13}}, 2,
     "LimitedByDatabase"),
    ("database-caps-below-min-replicas", 0, 0, 0, {"params": replace(DB, min_replicas=4),
                                                   "depth": {"connection_budget": 13}}, 2, "LimitedByDatabase"),
    ("database-caps-the-clamp-to-min-replicas", 1, 0, 0, {"params": replace(DB, min_replicas=4),
                                                          "depth": {"connection_budget": 13}}, 2, "LimitedByDatabase"),
    ("database-caps-a-hold-at-min-replicas", 0, 50, 0, {"params": replace(DB, min_replicas=3),
                                                        "depth": {"connection_budget": 7}, "flow": {"paused": True}},
     1, "LimitedByDatabase"),
    ("database-without-room-keeps-zero", 0, 500, 0, {"params": DB, "depth": {"connection_budget": 5}}, 0,
     "LimitedByDatabase"),
    ("database-never-takes-running-replicas", 5, 500, 0, {"params": DB, "depth": {"connection_budget": 13}}, 5,
     "LimitedByDatabase"),
    ("database-never-forces-a-scale-down", 5, 50, 0, {"params": DB, "depth": {"connection_budget": 0}}, 5, "Steady"),
    ("database-lets-demand-scale-down", 5, 5, 0, {"params": replace(DB, scale_down_stabilization_seconds=60),
                                                  "depth": {"connection_budget": 0}, "history": ((61, 5),)},
     1, "ScaledDown"),
    ("database-budget-lower-than-concurrency", 1, 500, 0, {"params": DB, "depth": {"connection_budget": 12},
                                                           "flow": {"max_running": 40}}, 2, "LimitedByDatabase"),
    ("database-budget-above-need-is-silent", 1, 15, 0, {"params": DB, "depth": {"connection_budget": 100}}, 2,
     "ScaledUp"),
    ("database-budget-without-connections-per-replica-is-silent", 1, 500, 0, {"depth": {"connection_budget": 6}},
     10, "ScaledUp"),
    ("database-caps-a-wait-limit", 2, 3, 2, {"params": replace(DB, max_wait_seconds=30),
                                             "depth": {"oldest_ready_age_seconds": 45, "connection_budget": 12}},
     2, "LimitedByDatabase"),
    # lookaheadSeconds: tasks due soon count as ready
    ("lookahead-starts-pods-before-due", 0, 0, 0, {"depth": {"due_soon": 30}}, 6, "DueSoon"),
    ("lookahead-raises-the-count", 2, 5, 5, {"depth": {"due_soon": 20}}, 6, "DueSoon"),
    ("lookahead-wobble-is-tolerated", 4, 20, 0, {"depth": {"due_soon": 1}}, 4, "WithinTolerance"),
    ("lookahead-nothing-due-is-plain", 2, 10, 0, {"depth": {"due_soon": 0}}, 2, "Steady"),
    # throughputFloor: the slots a steady flow keeps busy (finish rate x duration)
    ("throughput-floor-raises", 1, 1, 1, {"depth": {"finish_rate": 10.0, "recent_task_seconds": 2.0}}, 4,
     "ThroughputFloor"),
    ("throughput-floor-holds", 4, 1, 1, {"depth": {"finish_rate": 10.0, "recent_task_seconds": 2.0}}, 4,
     "ThroughputFloor"),
    ("throughput-floor-up-to-max", 1, 1, 1, {"depth": {"finish_rate": 100.0, "recent_task_seconds": 2.0}}, 10,
     "ThroughputFloor"),
    ("throughput-floor-below-count-is-silent", 2, 50, 0, {"depth": {"finish_rate": 1.0, "recent_task_seconds": 1.0}},
     10, "ScaledUp"),
    ("throughput-floor-capped-by-flow", 1, 1, 1, {"depth": {"finish_rate": 10.0, "recent_task_seconds": 2.0},
                                                  "flow": {"max_running": 10}}, 2, "LimitedByConcurrency"),
    ("throughput-floor-never-keeps-an-idle-queue", 3, 0, 0, {"depth": {"finish_rate": 10.0,
                                                                       "recent_task_seconds": 2.0},
                                                             "last_active": NOW - 999}, 0, "ScaledToZero"),
    # maxWaitSeconds: one more replica per tick while the head of the queue waits too long
    ("wait-under-the-limit", 1, 3, 2, {"params": ScalingParams(max_wait_seconds=30, tasks_per_replica=5),
                                       "depth": {"oldest_ready_age_seconds": 20}}, 1, "Steady"),
    ("wait-too-long-adds-one", 1, 3, 2, {"params": ScalingParams(max_wait_seconds=30, tasks_per_replica=5),
                                         "depth": {"oldest_ready_age_seconds": 45}}, 2, "WaitTooLong"),
    ("wait-too-long-above-the-count", 3, 3, 2, {"params": ScalingParams(max_wait_seconds=30, tasks_per_replica=5),
                                                "depth": {"oldest_ready_age_seconds": 45}}, 4, "WaitTooLong"),
    ("wait-too-long-stops-at-max", 10, 60, 0, {"params": ScalingParams(max_wait_seconds=30, tasks_per_replica=5),
                                               "depth": {"oldest_ready_age_seconds": 45}}, 10, "Steady"),
    ("wait-without-ready-tasks-is-nothing", 2, 0, 10, {"params": ScalingParams(max_wait_seconds=30,
                                                                               tasks_per_replica=5),
                                                       "depth": {"oldest_ready_age_seconds": 45}}, 2, "Steady"),
    ("wait-capped-by-flow", 2, 3, 2, {"params": ScalingParams(max_wait_seconds=30, tasks_per_replica=5),
                                      "depth": {"oldest_ready_age_seconds": 45}, "flow": {"max_running": 10},
                                      "history": ((30, 2),)}, 2, "LimitedByConcurrency"),
]


@pytest.mark.parametrize(("current", "ready", "running", "kwargs", "expected", "reason"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decision_table(current, ready, running, kwargs, expected, reason):
    decision = run(current, ready, running, **kwargs)
    assert (decision.desired_replicas, decision.reason) == (expected, reason), decision.message


def test_the_database_budget_shows_in_the_limited_condition_when_it_binds():
    """The decision names the budget as its limit (the `Limited` condition) when it lowered the count,
    also when another limit is looser, and not when it left the count alone."""
    bound = run(1, 500, params=DB, depth={"connection_budget": 20}, flow={"max_running": 100})
    assert bound.limit is not None and (bound.limit.reason, bound.limit.replicas) == ("LimitedByDatabase", 3)
    assert "budget of 20 connections for these workers, 6 per replica" in bound.message
    assert run(1, 15, params=DB, depth={"connection_budget": 100}).limit is None


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 12), st.integers(0, 500), st.integers(0, 60), st.integers(0, 5), st.integers(1, 18))
def test_the_database_budget_never_scales_past_itself(current, ready, budget, min_replicas, per_replica):
    """Whatever the rules say (minReplicas included), the replicas never rise above both the current
    count and what the budget holds; the budget never takes away replicas that run now."""
    params = ScalingParams(min_replicas=min_replicas, max_replicas=12, tasks_per_replica=10,
                           connections_per_replica=per_replica)
    decision = run(current, ready, params=params, depth={"connection_budget": budget})
    assert decision.desired_replicas <= max(current, budget // per_replica)
    unbounded = run(current, ready, params=params)
    assert decision.desired_replicas >= min(current, unbounded.desired_replicas)


def test_history_stays_short_and_keeps_the_window_maximum():
    history: tuple[Recommendation, ...] = ()
    for t, replicas in enumerate([3, 5, 4, 4, 2, 6, 1, 1, 3]):
        decision = decide(PolicyInputs(P, 6, QueueDepth(replicas * 5, 0), float(t), history, float(t)))
        history = decision.history
    assert [r.replicas for r in history] == [6, 3]  # strictly decreasing, newest last
    assert history[-1].time == 8.0


def test_idle_or_steady_at_the_floor_keeps_no_history():
    assert run(0, 0).history == ()
    assert run(1, 3).history == ()  # steady at 1 (the lowest non-zero target)
    assert run(2, 0, params=ScalingParams(min_replicas=2), history=((5, 2),)).history == ()


def test_fallback_sets_the_flag_and_keeps_last_active():
    decision = run(1, None, params=ScalingParams(fallback_replicas=2), last_active=NOW - 5)
    assert decision.fallback and decision.active is None and decision.last_active_time == NOW - 5


# --- properties ------------------------------------------------------------------------------------

params_strategy = st.builds(
    lambda lo, span, tpr, act, window, cooldown, fallback, max_wait: ScalingParams(
        min_replicas=lo, max_replicas=max(1, lo + span), tasks_per_replica=tpr, activation_tasks=act,
        scale_down_stabilization_seconds=window, cooldown_seconds=cooldown, fallback_replicas=fallback,
        max_wait_seconds=max_wait),
    st.integers(0, 5), st.integers(0, 30), st.integers(1, 50), st.integers(0, 20),
    st.floats(0, 600), st.floats(0, 600), st.none() | st.integers(0, 40), st.none() | st.floats(1, 600))
depth_strategy = st.none() | st.builds(
    QueueDepth, st.integers(0, 5000), st.integers(0, 500), oldest_ready_age_seconds=st.none() | st.floats(0, 1000),
    due_soon=st.integers(0, 5000), finish_rate=st.none() | st.floats(0, 10_000),
    recent_task_seconds=st.none() | st.floats(0, 3600),
    max_running=st.none() | st.integers(0, 1000))
history_strategy = st.lists(st.tuples(st.floats(0, 700), st.integers(0, 40)), max_size=8).map(
    lambda items: tuple(Recommendation(NOW - age, n) for age, n in sorted(items, reverse=True)))


@st.composite
def inputs_strategy(draw) -> PolicyInputs:
    params = draw(params_strategy)
    last_active = draw(st.none() | st.floats(NOW - 1000, NOW))
    return PolicyInputs(params, draw(st.integers(0, 40)), draw(depth_strategy), NOW, draw(history_strategy),
                        last_active, None)


@settings(max_examples=500, deadline=None)
@given(inputs_strategy())
def test_never_outside_bounds(inputs):
    decision = decide(inputs)
    p = inputs.params
    assert p.min_replicas <= decision.desired_replicas <= p.max_replicas


@settings(max_examples=500, deadline=None)
@given(inputs_strategy())
def test_no_scale_down_on_errors(inputs):
    inputs = PolicyInputs(inputs.params, inputs.current_replicas, None, NOW, inputs.history, inputs.last_active_time)
    assert decide(inputs).desired_replicas >= min(inputs.current_replicas, inputs.params.max_replicas)


@settings(max_examples=500, deadline=None)
@given(inputs_strategy())
def test_zero_only_after_cooldown_with_nothing_to_do(inputs):
    decision = decide(inputs)
    if decision.desired_replicas == 0 and inputs.current_replicas > 0:
        assert inputs.depth is not None and inputs.depth.demand == 0
        assert inputs.last_active_time is None or NOW - inputs.last_active_time >= inputs.params.cooldown_seconds


@settings(max_examples=500, deadline=None)
@given(inputs_strategy())
def test_scale_down_honours_the_window(inputs):
    """Never below the highest recommendation made inside the stabilization window."""
    decision = decide(inputs)
    p = inputs.params
    if decision.desired_replicas == 0 or decision.desired_replicas >= inputs.current_replicas:
        return
    in_window = [r.replicas for r in inputs.history if NOW - r.time <= p.scale_down_stabilization_seconds]
    if inputs.current_replicas <= p.max_replicas:
        assert decision.desired_replicas >= min(inputs.current_replicas, max(in_window, default=0))


@settings(max_examples=300, deadline=None)
@given(params_strategy, st.integers(1, 30), st.floats(-0.1, 0.1))
def test_no_flapping_inside_tolerance(params, current, noise):
    """Demand that wobbles within the tolerance of the current capacity never changes the count."""
    if not params.min_replicas <= current <= params.max_replicas:
        return
    demand = round(current * params.tasks_per_replica * (1 + noise))
    if demand <= params.activation_tasks or abs(demand / (current * params.tasks_per_replica) - 1) > params.tolerance:
        return
    decision = decide(PolicyInputs(params, current, QueueDepth(demand, 0), NOW, (), NOW))
    assert decision.desired_replicas == current, decision.message


@settings(max_examples=300, deadline=None)
@given(inputs_strategy())
def test_history_is_strictly_decreasing_and_inside_the_window(inputs):
    history = decide(inputs).history
    assert all(a.replicas > b.replicas for a, b in zip(history, history[1:]))
    assert all(r.replicas > max(inputs.params.min_replicas, 1) for r in history)
    assert all(NOW - r.time <= inputs.params.scale_down_stabilization_seconds for r in history)


@settings(max_examples=500, deadline=None)
@given(inputs_strategy())
def test_a_wait_limit_adds_exactly_one_replica_and_never_scales_down(inputs):
    decision = decide(inputs)
    if decision.reason == "WaitTooLong":
        assert decision.desired_replicas == inputs.current_replicas + 1
        assert inputs.depth.oldest_ready_age_seconds > inputs.params.max_wait_seconds


def test_the_policys_defaults_are_those_of_a_queueworker_that_sets_none():
    """ScalingParams() (what the demo and direct callers start from) decides as a QueueWorker whose
    spec.scaling is empty: tasksPerReplica is then its concurrency (tests/test_crd.py holds the
    CRD's defaults to the same spec)."""
    from queueworker_controller.spec import QueueWorkerSpec

    minimal = QueueWorkerSpec.from_dict({"queue": "q", "image": "i", "database": {"secretRef": {"name": "s"}}})
    assert ScalingParams() == minimal.scaling_params()
