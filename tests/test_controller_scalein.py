"""Pricing worker pods for lease-aware scale-in."""

from __future__ import annotations

from queueworker_controller.queuedb import WorkerLease
from queueworker_controller.scalein import deletion_costs


def test_idle_and_unknown_pods_are_cheapest_busy_pods_dearest():
    costs = deletion_costs(
        ["idle", "busy-old", "busy-new", "busier", "draining", "starting"],
        [WorkerLease("idle", 0, False, None), WorkerLease("busy-old", 1, False, 500.0),
         WorkerLease("busy-new", 1, False, 3.0), WorkerLease("busier", 3, False, 1.0),
         WorkerLease("draining", 2, True, 50.0)])
    assert sorted(costs, key=costs.get) == ["draining", "idle", "starting", "busy-new", "busy-old", "busier"]
    assert costs["idle"] == costs["starting"] == 0


def test_a_restarted_worker_in_the_same_pod_keeps_the_dearer_price():
    costs = deletion_costs(["p"], [WorkerLease("p", 0, False, None), WorkerLease("p", 2, False, 10.0)])
    assert costs["p"] == 2010


def test_age_is_capped_below_one_more_lease():
    assert deletion_costs(["p"], [WorkerLease("p", 1, False, 10**9)])["p"] < 2000
