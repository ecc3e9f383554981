"""One reconciler tick against in-memory fakes of the Kubernetes API and the queue database."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from queueworker_controller.kube import SecretUnavailable
from queueworker_controller.policy import QueueDepth
from queueworker_controller.queuedb import WorkerLease
from queueworker_controller.reconcile import ObjectMemory, QueueWorkerObject, Reconciler

SPEC = {"queue": "jobs", "image": "img", "database": {"secretRef": {"name": "db", "key": "url"}},
        "concurrency": 2, "drainSeconds": 5,
        "scaling": {"maxReplicas": 5, "pollingIntervalSeconds": 10, "scaleDownStabilizationSeconds": 0,
                    "cooldownSeconds": 0}}


class FakeKube:
    def __init__(self, replicas: int | None = None):
        self.deployments: dict[str, dict[str, Any]] = {}
        self.scaled: list[int] = []
        self.costs: dict[str, int] = {}
        self.secret: str | None = "postgresql://db/app"
        self.replicas_at_start = replicas

    def read_deployment(self, namespace, name):
        return self.deployments.get(name)

    def create_deployment(self, namespace, body, replicas):
        created = {**body, "spec": {**body["spec"], "replicas": self.replicas_at_start if
                                    self.replicas_at_start is not None else replicas}}
        self.deployments[body["metadata"]["name"]] = created
        return created

    def update_deployment(self, current, rendered):
        updated = {**rendered, "spec": {**rendered["spec"], "replicas": current["spec"]["replicas"]}}
        self.deployments[rendered["metadata"]["name"]] = updated
        return updated

    def scale_deployment(self, namespace, name, replicas):
        self.scaled.append(replicas)
        self.deployments[name]["spec"]["replicas"] = replicas

    def read_secret_value(self, namespace, name, key):
        if self.secret is None:
            raise SecretUnavailable(f"Secret {namespace}/{name}: Not Found (404)")
        return self.secret

    def list_pods(self, namespace, selector):
        return [{"metadata": {"name": n}} for n in ("idle", "busy")]

    def set_deletion_cost(self, namespace, pod, cost):
        self.costs[pod] = cost


class FakeDatabases:
    def __init__(self, depth: QueueDepth | None):
        self.depth_value = depth
        self.notified = False

    async def depth(self, dsn, queue, cap):
        if self.depth_value is None:
            raise psycopg.OperationalError("connection refused")
        return self.depth_value

    def listen(self, dsn):
        self.listening = dsn

    def notified_since(self, dsn, queue, since):
        return self.notified

    async def worker_leases(self, dsn, namespace, queue):
        return [WorkerLease("idle", 0, False, None), WorkerLease("busy", 1, False, 30.0)]


def tick(kube: FakeKube, depth: QueueDepth | None, spec: dict | None = None, status: dict | None = None,
         memory: ObjectMemory | None = None, generation: int = 1):
    reconciler = Reconciler(kube, FakeDatabases(depth), wall_clock=lambda: 1_000_000.0)  # type: ignore[arg-type]
    obj = QueueWorkerObject("w", "ns", "uid", generation, spec or SPEC, status or {})
    return asyncio.run(reconciler.tick(obj, memory or ObjectMemory()))


def conditions(result) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in result.status["conditions"]}


def test_scale_up_creates_the_deployment_and_reports():
    kube = FakeKube()
    result = tick(kube, QueueDepth(ready=7, running=1))
    assert kube.scaled == [4]
    assert result.status["replicas"] == result.status["desiredReplicas"] == 4
    assert result.status["queueDepth"] == {"ready": 7, "running": 1, "retrying": 0, "oldestReadyAgeSeconds": 0.0}
    assert [(e.type, e.reason) for e in result.events] == [("Normal", "Activated")]
    assert conditions(result)["Ready"] == ("True", "QueueReadable")
    assert conditions(result)["Active"] == ("True", "QueueActive")


def test_scale_down_prices_pods_first():
    kube = FakeKube(replicas=3)
    tick(kube, QueueDepth(ready=0, running=1))
    assert kube.scaled == [1]
    assert kube.costs == {"idle": 0, "busy": 1030}


def test_paused_leaves_replicas_alone():
    kube = FakeKube(replicas=2)
    result = tick(kube, QueueDepth(ready=100, running=0), {**SPEC, "scaling": {**SPEC["scaling"], "paused": True}})
    assert kube.scaled == [] and result.status["replicas"] == result.status["desiredReplicas"] == 2
    assert result.status["reason"] == "Paused" and conditions(result)["Paused"] == ("True", "Paused")


def test_dry_run_reports_without_scaling():
    kube = FakeKube(replicas=1)
    result = tick(kube, QueueDepth(ready=100, running=0), {**SPEC, "scaling": {**SPEC["scaling"], "dryRun": True}})
    assert kube.scaled == [] and result.status["replicas"] == 1 and result.status["desiredReplicas"] == 5
    assert [e.reason for e in result.events] == ["DryRun"]


@pytest.mark.parametrize(("secret", "depth", "reason"), [
    (None, QueueDepth(0, 0), "SecretUnavailable"),
    ("postgresql://db/app", None, "DatabaseUnreachable"),
])
def test_errors_hold_replicas_and_say_why(secret, depth, reason):
    kube = FakeKube(replicas=3)
    kube.secret = secret
    result = tick(kube, depth, status={"lastActiveTime": "2000-01-01T00:00:00Z"})
    assert kube.scaled == [] and result.status["desiredReplicas"] == 3
    assert conditions(result)["Ready"] == ("False", reason)
    assert conditions(result)["Active"][0] == "Unknown"
    assert [(e.type, e.reason) for e in result.events] == [("Warning", reason)]
    assert "queueDepth" not in result.status


def test_recovery_is_announced_once():
    kube = FakeKube(replicas=3)
    failed = tick(kube, None)
    recovered = tick(kube, QueueDepth(ready=6, running=0), status=failed.status)
    assert [e.reason for e in recovered.events] == ["Recovered"]
    assert tick(kube, QueueDepth(ready=6, running=0), status={**failed.status, **recovered.status}).events == []


def test_an_unchanged_status_is_not_rewritten():
    kube = FakeKube()
    first = tick(kube, QueueDepth(0, 0))
    assert tick(kube, QueueDepth(0, 0), status=first.status).status == {}
    assert tick(kube, QueueDepth(1, 0), status=first.status).status.keys() >= {"queueDepth", "lastPollTime"}


def test_drain_safety_condition_follows_the_grace_period():
    kube = FakeKube()
    unsafe = {**SPEC, "template": {"spec": {"terminationGracePeriodSeconds": 3}}}
    assert conditions(tick(kube, QueueDepth(0, 0), unsafe))["DrainSafe"] == ("False", "GracePeriodTooShort")
    assert conditions(tick(FakeKube(), QueueDepth(0, 0)))["DrainSafe"] == ("True", "GracePeriodCoversDrain")


def test_spec_change_rolls_the_deployment_but_keeps_replicas():
    kube = FakeKube(replicas=4)
    tick(kube, QueueDepth(ready=8, running=0))
    tick(kube, QueueDepth(ready=8, running=0), {**SPEC, "image": "img:2"}, generation=2)
    deployment = kube.deployments["w-worker"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "img:2"
    assert deployment["spec"]["replicas"] == 4


def test_ticks_wait_for_the_polling_interval_unless_the_spec_changed_or_tasks_arrived():
    clock = [100.0]
    databases = FakeDatabases(QueueDepth(0, 0))
    reconciler = Reconciler(FakeKube(), databases, monotonic=lambda: clock[0])  # type: ignore[arg-type]
    obj, memory = QueueWorkerObject("w", "ns", "uid", 1, SPEC, {}), ObjectMemory()
    assert reconciler.due(obj, memory)
    asyncio.run(reconciler.tick(obj, memory))
    assert databases.listening == "postgresql://db/app"
    assert not reconciler.due(obj, memory)
    assert reconciler.due(QueueWorkerObject("w", "ns", "uid", 2, SPEC, {}), memory)
    databases.notified = True
    assert not reconciler.due(obj, memory)  # not twice within MIN_NOTIFIED_POLL_SECONDS
    clock[0] += 1.0
    assert reconciler.due(obj, memory)
    clock[0] += 9.0
    databases.notified = False
    assert reconciler.due(obj, memory)  # pollingIntervalSeconds=10


def test_a_deployment_owned_by_someone_else_is_left_alone():
    kube = FakeKube()
    kube.deployments["w-worker"] = {"metadata": {"name": "w-worker", "annotations": {}}, "spec": {"replicas": 7}}
    result = tick(kube, QueueDepth(ready=100, running=0))
    assert conditions(result)["Ready"] == ("False", "DeploymentNotOwned")
    assert kube.scaled == [] and kube.deployments["w-worker"]["spec"] == {"replicas": 7}


def test_an_unusable_spec_is_reported_not_raised():
    result = tick(FakeKube(), QueueDepth(0, 0), {"queue": "q"})
    assert conditions(result)["Ready"] == ("False", "InvalidSpec")


def test_the_scale_down_window_survives_a_controller_restart():
    spec = {**SPEC, "scaling": {**SPEC["scaling"], "scaleDownStabilizationSeconds": 300, "cooldownSeconds": 300}}
    kube = FakeKube(replicas=5)
    busy = tick(kube, QueueDepth(ready=10, running=0), spec)
    assert busy.status["recommendations"][0]["replicas"] == 5
    after_restart = tick(kube, QueueDepth(ready=0, running=1), spec, status=busy.status, memory=ObjectMemory())
    assert kube.scaled == [] and after_restart.status["reason"] == "Stabilizing"
