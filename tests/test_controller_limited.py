"""The controller's side of per-key limits, tick by tick with fakes for Kubernetes and the database:
the replicas bounded by what the keys let run, the `Limited` condition, the status and the gauges."""

from __future__ import annotations

import asyncio

from queueworker.runtime.worker import CONNECTIONS_PER_WORKER
from queueworker.scaling.policy import QueueDepth
from queueworker_controller import metrics
from tests.test_controller_reconcile import FakeKube, conditions, tick


def test_per_key_limits_cap_the_replicas_and_say_so_in_the_limited_condition():
    """What the keys let run bounds the replicas (LimitedByKeys), a backlog whose keys are all held is
    no reason to scale (KeysHeld), and the keys' gauges follow, one series per state, never per key."""
    kube = FakeKube(replicas=1)
    capped = tick(kube, QueueDepth(ready=100, running=0, key_limited=True, key_slots=4, keys_ready=2, keys_held=0))
    assert (capped.status["desiredReplicas"], capped.status["reason"]) == (2, "LimitedByKeys")
    assert conditions(capped)["Limited"] == ("True", "LimitedByKeys")
    assert "its keys can run 4 tasks at once" in capped.status["message"]
    assert {k: capped.status["queueDepth"][k] for k in ("keySlots", "keysReady", "keysHeld")} == {
        "keySlots": 4, "keysReady": 2, "keysHeld": 0}
    assert metrics.key_slots.labels("ns", "w")._value.get() == 4

    held = tick(FakeKube(replicas=3), QueueDepth(ready=100, running=2, key_limited=True, key_slots=2,
                                                 keys_ready=5, keys_held=5))
    assert (held.status["desiredReplicas"], held.status["reason"]) == (3, "KeysHeld")
    assert conditions(held)["Limited"] == ("True", "KeysHeld")
    assert metrics.queue_keys.labels("ns", "w", "held")._value.get() == 5

    free = tick(FakeKube(replicas=1), QueueDepth(ready=100, running=0, key_limited=True, key_slots=None,
                                                 keys_ready=40, keys_held=1))
    assert (free.status["desiredReplicas"], free.status["reason"]) == (5, "ScaledUp")
    assert conditions(free)["Limited"] == ("False", "NotLimited") and "keySlots" not in free.status["queueDepth"]
    plain = tick(FakeKube(replicas=1), QueueDepth(ready=0, running=1))
    assert "keysReady" not in plain.status["queueDepth"]
    exported = {(s.name, tuple(sorted(s.labels.items()))) for m in (metrics.queue_keys, metrics.key_slots)
                for f in m.collect() for s in f.samples if s.labels.get("name") == "w"}
    assert exported == set(), "a queue without per-key limits has no key series"


def test_queueworkers_on_one_database_take_their_shares_of_its_budget_in_turn():
    """Two QueueWorkers whose depth reads return together: the first to decide takes what is free of
    the database's budget (4 replicas' worth plus 10, less 7 of other roles, less the controller's 3), the
    other sees it taken and starts none; once the first is deleted its share goes to the other."""
    from queueworker_controller.reconcile import ObjectMemory, QueueWorkerObject, Reconciler
    from queueworker_controller.redaction import KnownSecrets
    from tests.test_controller_reconcile import SPEC, FakeDatabases

    kube = FakeKube()
    limit = 4 * CONNECTIONS_PER_WORKER + 10
    reconciler = Reconciler(kube, FakeDatabases(QueueDepth(ready=100, running=0, connection_limit=limit,  # type: ignore[arg-type]
                                                           other_role_connections=7)),
                            wall_clock=lambda: 1_000_000.0, secrets=KnownSecrets())
    first, second = (QueueWorkerObject(name, "ns", f"uid-{name}", 1, SPEC, {}) for name in ("first", "second"))

    async def together():
        return await asyncio.gather(reconciler.tick(first, ObjectMemory()), reconciler.tick(second, ObjectMemory()))

    async def after_deleting(taker: QueueWorkerObject, other: QueueWorkerObject):
        await reconciler.forget("ns", taker.name)
        return await reconciler.tick(other, ObjectMemory())
    try:
        # Which read returns first is up to the event loop; the shares are taken in that order.
        (taker, took), (other, left) = sorted(zip((first, second), asyncio.run(together())),
                                              key=lambda pair: -pair[1].status["desiredReplicas"])
        assert (took.status["desiredReplicas"], took.status["reason"]) == (4, "LimitedByDatabase")
        assert took.status["queueDepth"]["connectionBudget"] == 4 * CONNECTIONS_PER_WORKER
        assert (left.status["desiredReplicas"], left.status["reason"]) == (0, "LimitedByDatabase")
        assert left.status["queueDepth"]["connectionBudget"] == 0
        assert conditions(left)["Limited"] == ("True", "LimitedByDatabase")
        assert asyncio.run(after_deleting(taker, other)).status["desiredReplicas"] == 4
    finally:
        reconciler.close()
