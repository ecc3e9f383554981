"""The controller's view of its worker Deployments (controller/deployment.py, DeploymentCache):
fed by the watch and by the reconciler's own reads and writes, never older than what the watch delivered."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from queueworker.scaling.policy import QueueDepth
from queueworker_controller.reconcile import ObjectMemory, QueueWorkerObject, Reconciler
from queueworker_controller.redaction import KnownSecrets
from tests.test_controller_reconcile import SPEC, FakeDatabases, FakeKube, conditions


def test_queueworkers_share_secret_reads_and_read_no_deployment_the_watch_delivered():
    kube, clock = FakeKube(), [100.0]
    databases = FakeDatabases(QueueDepth(0, 0))
    reconciler = Reconciler(kube, databases, secrets=KnownSecrets(), monotonic=lambda: clock[0])  # type: ignore[arg-type]
    a, b = (QueueWorkerObject(name, "ns", f"uid-{name}", 1, SPEC, {}) for name in ("a", "b"))
    memories = {"a": ObjectMemory(), "b": ObjectMemory()}

    def tick_both() -> None:
        for obj in (a, b):
            asyncio.run(reconciler.tick(obj, memories[obj.name]))
    try:
        tick_both()
        assert (kube.secret_reads, kube.deployment_reads, kube.writes) == (1, 2, 2), "one Secret read for both"
        tick_both()
        assert (kube.secret_reads, kube.deployment_reads) == (1, 2), "the Deployments they created are known"
        reconciler.deployments.drop("ns", "a-worker")  # the watch said it was deleted
        clock[0] += 30  # SECRET_REFRESH_SECONDS
        tick_both()
        assert (kube.secret_reads, kube.deployment_reads) == (2, 3)
        databases.depth_value = None  # the database refuses: perhaps the Secret was rotated
        asyncio.run(reconciler.tick(a, memories["a"]))
        asyncio.run(reconciler.tick(a, memories["a"]))
        assert kube.secret_reads == 3, "read again at once after a failed depth read"
    finally:
        reconciler.close()


class WatchDuringWrites(FakeKube):
    """The API server's watch delivers a newer view of the Deployment (its pods refused) while the
    reconciler's create or scale request is still in flight, as it can on a loaded cluster."""

    REFUSED_PODS = {"conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                                    "message": 'pods "w-worker-1" is forbidden: violates PodSecurity'}]}

    def __init__(self, during: str):
        super().__init__()
        self.during = during
        self.deliver: Callable[[dict[str, Any]], None] | None = None  # the watch, on the event loop

    def _watch_delivers(self, name: str) -> None:
        newer = {**self.deployments[name], "status": self.REFUSED_PODS}
        newer["metadata"] = {**newer["metadata"], "resourceVersion": "2"}
        assert self.deliver is not None
        self.deliver(newer)

    def create_deployment(self, namespace, body, replicas):
        created = super().create_deployment(namespace, body, replicas)
        created["metadata"] = {**created["metadata"], "namespace": namespace, "resourceVersion": "1"}
        if self.during == "create":
            self._watch_delivers(body["metadata"]["name"])
        return created

    def scale_deployment(self, namespace, name, replicas):
        super().scale_deployment(namespace, name, replicas)
        if self.during == "scale":
            self._watch_delivers(name)


@pytest.mark.parametrize("during", ["create", "scale"])
def test_a_view_the_watch_delivers_during_a_write_is_not_hidden_by_the_write(during):
    kube = WatchDuringWrites(during)
    reconciler = Reconciler(kube, FakeDatabases(QueueDepth(7, 1)), secrets=KnownSecrets())  # type: ignore[arg-type]
    obj = QueueWorkerObject("w", "ns", "uid", 1, SPEC, {})

    async def scenario():
        loop = asyncio.get_running_loop()

        def deliver(deployment: dict[str, Any]) -> None:  # runs on the Kubernetes thread: waits for the loop
            asyncio.run_coroutine_threadsafe(delivered(deployment), loop).result(timeout=10)

        async def delivered(deployment: dict[str, Any]) -> None:
            reconciler.deployments.put(deployment)
        kube.deliver = deliver
        first = await reconciler.tick(obj, ObjectMemory())
        second = await reconciler.tick(replace(obj, status=first.status), ObjectMemory())
        return first, second
    try:
        first, second = asyncio.run(scenario())
    finally:
        reconciler.close()
    assert kube.scaled == [4] and first.status["replicas"] == 4
    cached = reconciler.deployments.get("ns", "w-worker")
    assert cached is not None and cached["status"] == WatchDuringWrites.REFUSED_PODS
    assert cached["spec"]["replicas"] == 4, "the scale is kept on top of the newer view"
    assert conditions(second)["ReplicaFailure"] == ("True", "FailedCreate")
