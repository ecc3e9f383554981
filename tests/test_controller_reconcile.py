"""One reconciler tick against in-memory fakes of the Kubernetes API and the queue database."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

from queueworker_controller import metrics, reconcile
from queueworker_controller.deployment import SECRET_VERSION_ANNOTATION, secret_version
from queueworker_controller.kube import FoundScaleTarget, ScaleTargetUnavailable, SecretUnavailable, SecretValue
from queueworker.scaling.policy import QueueDepth
from queueworker.scaling.resource import QueueDepthField, StatusField
from queueworker_controller.queuedb import WorkerLease
from queueworker_controller.reconcile import ObjectMemory, QueueWorkerObject, Reconciler
from queueworker_controller.redaction import KnownSecrets
from queueworker_controller.spec import SCALED_BY_ANNOTATION
from tests.pod_templates import REFUSED

SPEC = {"queue": "jobs", "image": "img", "database": {"secretRef": {"name": "db", "key": "url"}},
        "concurrency": 2, "drainSeconds": 5,
        "scaling": {"maxReplicas": 5, "pollingIntervalSeconds": 10, "scaleDownStabilizationSeconds": 0,
                    "cooldownSeconds": 0}}


class FakeKube:
    def __init__(self, replicas: int | None = None):
        self.deployments: dict[str, dict[str, Any]] = {}
        self.scaled: list[int] = []
        self.costs: dict[str, int] = {}
        self.secret: str | bytes | None = "postgresql://db/app"
        self.secret_version = "1"
        self.replicas_at_start = replicas
        self.writes = 0
        self.statuses: list[dict[str, Any]] = []
        self.deployment_reads = self.secret_reads = 0
        self.target: dict[str, Any] | None = None  # a scaleTargetRef's workload
        self.target_replicas = 1
        self.target_scaled: list[tuple[str, str, int]] = []

    def read_deployment(self, namespace, name):
        self.deployment_reads += 1
        return self.deployments.get(name)

    def create_deployment(self, namespace, body, replicas):
        self.writes += 1
        created = {**body, "spec": {**body["spec"], "replicas": self.replicas_at_start if
                                    self.replicas_at_start is not None else replicas}}
        self.deployments[body["metadata"]["name"]] = created
        return created

    def update_deployment(self, current, rendered):
        self.writes += 1
        updated = {**rendered, "spec": {**rendered["spec"], "replicas": current["spec"]["replicas"]}}
        self.deployments[rendered["metadata"]["name"]] = updated
        return updated

    def scale_deployment(self, namespace, name, replicas):
        self.scaled.append(replicas)
        self.deployments[name]["spec"]["replicas"] = replicas

    def read_secret(self, namespace, name, key):
        self.secret_reads += 1
        if self.secret is None:
            raise SecretUnavailable(f"Secret {namespace}/{name}: Not Found (404)")
        data = self.secret.encode() if isinstance(self.secret, str) else self.secret
        return SecretValue(data, self.secret_version)

    def patch_status(self, namespace, name, status):
        self.statuses.append(status)

    def read_scale_target(self, namespace, ref):
        if self.target is None:
            raise ScaleTargetUnavailable(f"the API server knows no single resource of kind {ref.kind}")
        return FoundScaleTarget({"spec": {"replicas": self.target_replicas},
                                 "status": {"replicas": self.target_replicas, "selector": "app=mine"}},
                                self.target)

    def scale_target(self, namespace, ref, replicas):
        self.target_scaled.append((ref.kind, ref.name, replicas))
        self.target_replicas = replicas

    def list_pods(self, namespace, selector):
        return [{"metadata": {"name": n}} for n in ("idle", "busy")]

    def set_deletion_cost(self, namespace, pod, cost):
        self.costs[pod] = cost


class FakeDatabases:
    def __init__(self, depth: QueueDepth | None, error: Exception | None = None):
        self.depth_value = depth
        self.error = error or psycopg.OperationalError("connection refused")
        self.listens = False
        self.bindings: dict[Any, tuple[str, str]] = {}

    async def depth(self, dsn, queue, cap, lookahead_seconds=None, throughput=False):
        if self.depth_value is None:
            raise self.error
        return self.depth_value

    def bind(self, owner, dsn, queue, notify=None):
        self.bindings[owner] = (dsn, queue)
        self.notify = notify

    def release(self, owner):
        self.bindings.pop(owner, None)

    def listening(self, dsn):
        return self.listens

    @property
    def open_databases(self):
        return len(set(self.bindings.values()))

    def close(self):
        self.closed = True

    async def worker_leases(self, dsn, namespace, queue):
        return [WorkerLease("idle", 0, False, None), WorkerLease("busy", 1, False, 30.0)]


def tick(kube: FakeKube, depth: QueueDepth | None, spec: dict | None = None, status: dict | None = None,
         memory: ObjectMemory | None = None, generation: int = 1, databases: FakeDatabases | None = None,
         **options: Any):
    reconciler = Reconciler(kube, databases or FakeDatabases(depth), wall_clock=lambda: 1_000_000.0,  # type: ignore[arg-type]
                            secrets=KnownSecrets(), **options)
    obj = QueueWorkerObject("w", "ns", "uid", generation, spec or SPEC, status or {})
    try:
        return asyncio.run(reconciler.tick(obj, memory or ObjectMemory()))
    finally:
        reconciler.close()


def conditions(result) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in result.status["conditions"]}


def test_scale_up_creates_the_deployment_and_reports():
    kube = FakeKube()
    result = tick(kube, QueueDepth(ready=7, running=1))
    assert kube.scaled == [4]
    assert result.status["replicas"] == result.status["desiredReplicas"] == 4
    assert result.status["queueDepth"] == {"ready": 7, "running": 1, "retrying": 0, "blocked": 0, "dueSoon": 0,
                                             "oldestReadyAgeSeconds": 0.0}
    assert [(e.type, e.reason) for e in result.events] == [("Normal", "Activated")]
    assert conditions(result)["Ready"] == ("True", "QueueReadable")
    assert conditions(result)["Active"] == ("True", "QueueActive")


def test_a_tick_writes_the_status_fields_the_crd_declares():
    """Every field of queueworker.scaling.resource (tests/test_crd.py holds the CRD to it), and no other."""
    declared = {value for key, value in vars(StatusField).items() if key.isupper()}
    declared_depth = {value for key, value in vars(QueueDepthField).items() if key.isupper()}
    result = tick(FakeKube(), QueueDepth(7, 1, finish_rate=2.0, recent_task_seconds=1.5, key_limited=True, key_slots=9,
                                         connection_limit=99), {**SPEC, "scaling": {**SPEC["scaling"], "throughputFloor": True}})
    assert set(result.status) == declared - {StatusField.SCALE_TARGET}, "a first tick that scales writes them all"
    assert set(result.status[StatusField.QUEUE_DEPTH]) == declared_depth
    kube = FakeKube()
    kube.target = user_workload(["worker", "--drain-seconds", "5"])
    theirs = tick(kube, QueueDepth(ready=1, running=0), {**{k: v for k, v in SPEC.items() if k != "image"},
                                                          "scaleTargetRef": {"kind": "Deployment", "name": "mine"}})
    assert StatusField.SCALE_TARGET in theirs.status and set(theirs.status) <= declared


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
    assert reconciler.seconds_until_due(obj, memory) == 0
    asyncio.run(reconciler.tick(obj, memory))
    assert databases.bindings == {("ns", "w"): ("postgresql://db/app", "jobs")}
    assert databases.notify == memory.notified, "NOTIFYs for the queue reach this object's memory"
    assert reconciler.seconds_until_due(obj, memory) == 10  # pollingIntervalSeconds=10
    assert reconciler.seconds_until_due(QueueWorkerObject("w", "ns", "uid", 2, SPEC, {}), memory) == 0
    memory.notified(0.0)
    assert memory.wake.is_set() and reconciler.seconds_until_due(obj, memory) == 1.0, "not twice within 1 s"
    clock[0] += 1.0
    assert reconciler.seconds_until_due(obj, memory) == 0
    memory.notified_pending = False
    clock[0] += 4.0
    assert reconciler.seconds_until_due(obj, memory) == 5


def test_tasks_announced_for_later_wake_the_loop_when_due_less_the_lookahead():
    async def scenario() -> tuple[bool, float, float, bool]:
        memory = ObjectMemory(lookahead_seconds=0.2)
        now = time.time()
        memory.notified(now + 10)
        memory.notified(now + 0.5)  # the earlier one replaces the timer
        memory.notified(now + 5)  # a later one keeps it
        early = memory.wake.is_set()
        wake_at = memory.wake_at
        await asyncio.wait_for(memory.wake.wait(), 30)
        return early, wake_at - now, time.time() - now, memory.notified_pending
    early, timed_for, woken_after, pending = asyncio.run(scenario())
    assert not early
    assert timed_for == pytest.approx(0.3), "due at 0.5 s, looked at 0.2 s earlier"
    assert woken_after >= timed_for - 0.01 and pending, "woken then, not before"


class ManualClock:
    """Monotonic time that moves only when the test says so, and the loop's sleeps on it: a sleep
    ends once its Event is set or the clock has passed its end. `sleeps` hands the test the length of
    each sleep as the loop starts it: the loop then has nothing left to do until the sleep ends."""

    def __init__(self, now: float = 100.0):
        self.now = now
        self.sleeps: asyncio.Queue[float] = asyncio.Queue()
        self._moved = asyncio.Event()
        self._looked = asyncio.Event()

    def monotonic(self) -> float:
        return self.now

    async def advance(self, seconds: float) -> None:
        """Moves the clock on; returns once the sleeping loop has looked at the new time (and woken,
        when its sleep is over)."""
        self.now += seconds
        self._looked.clear()
        self._moved.set()
        await self._looked.wait()

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        end = self.now + timeout
        self.sleeps.put_nowait(timeout)
        while not event.is_set() and self.now < end:
            self._moved.clear()
            woken, moved = asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._moved.wait())
            try:
                await asyncio.wait({woken, moved}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
                moved.cancel()
            self._looked.set()
        return event.is_set()


def run_on_a_manual_clock(kube: FakeKube, databases: FakeDatabases,
                          scenario: Callable[[Reconciler, ManualClock], Awaitable[None]]) -> None:
    """Runs `scenario` with a Reconciler whose time is a ManualClock (at most 30 s of real time)."""
    async def main() -> None:
        clock = ManualClock()
        reconciler = Reconciler(kube, databases, secrets=KnownSecrets(),  # type: ignore[arg-type]
                                monotonic=clock.monotonic, wait=clock.wait)
        try:
            await asyncio.wait_for(scenario(reconciler, clock), 30)
        finally:
            reconciler.close()
    asyncio.run(main())


def test_the_loop_ticks_when_due_and_sleeps_otherwise():
    """The daemon's loop: a tick at once, then one per NOTIFY (at most one a second) and one per spec
    change; a failing status write is logged and the loop goes on. Time is the test's: the loop
    sleeps on a ManualClock, and each assertion is made while it sleeps."""
    kube = FakeKube()
    databases = FakeDatabases(QueueDepth(0, 0))
    generation = [1]
    ticks: list[int] = []

    async def publish(obj, result):
        ticks.append(obj.generation)
        if len(ticks) == 2:
            raise RuntimeError("the API server said no")

    async def scenario(reconciler: Reconciler, clock: ManualClock) -> None:
        memory = ObjectMemory()
        loop = asyncio.create_task(reconciler.run(
            lambda: QueueWorkerObject("w", "ns", "uid", generation[0], SPEC, {}), memory, publish))
        try:
            assert await clock.sleeps.get() == 10 and ticks == [1], "at once, then asleep until the next poll"
            databases.notify(0.0)
            assert await clock.sleeps.get() == 1 and ticks == [1], \
                "a NOTIFY within a second of the last poll waits for that second"
            await clock.advance(1)
            assert await clock.sleeps.get() == 10 and ticks == [1, 1]
            generation[0] = 2
            memory.wake.set()  # what kopf's event handler does on a new generation
            assert await clock.sleeps.get() == 10 and ticks == [1, 1, 2], "the failed write did not stop the loop"
            await clock.advance(9)
            assert ticks == [1, 1, 2], "nothing more until the next poll (10 s)"
            await clock.advance(1)
            assert await clock.sleeps.get() == 10 and ticks == [1, 1, 2, 2]
        finally:
            loop.cancel()

    run_on_a_manual_clock(kube, databases, scenario)


def test_a_view_behind_the_last_status_write_announces_no_reason_twice():
    """kopf's view of the object brings the controller's status write back only when the watch
    delivers it. Ticks that come first compute from the view with the fields written on top, so a
    Ready=False reason is announced once; once the view shows the writes, it is taken as it is."""
    kube = FakeKube()
    kube.secret = "ghp_0123456789abcdefTOKENTOKENTOKEN"
    view: dict[str, Any] = {}
    written: dict[str, Any] = {}
    warnings: list[str] = []

    async def publish(obj, result):
        written.update(result.status)
        warnings.extend(e.reason for e in result.events if e.type == "Warning")

    async def scenario(reconciler: Reconciler, clock: ManualClock) -> None:
        memory = ObjectMemory()
        loop = asyncio.create_task(reconciler.run(
            lambda: QueueWorkerObject("w", "ns", "uid", 1, SPEC, dict(view)), memory, publish))
        poll = SPEC["scaling"]["pollingIntervalSeconds"]
        try:
            assert await clock.sleeps.get() == poll
            for _ in range(2):  # the view still without the status written
                await clock.advance(poll)
                assert await clock.sleeps.get() == poll
            assert warnings == ["InvalidDatabaseUrl"] and memory.unseen_writes
            view.update(written)  # the watch delivered the writes
            await clock.advance(poll)
            assert await clock.sleeps.get() == poll
            assert warnings == ["InvalidDatabaseUrl"] and memory.unseen_writes is None
            view.clear()  # the view is taken as it is: an empty status has no reason yet
            await clock.advance(poll)
            assert await clock.sleeps.get() == poll
            assert warnings == ["InvalidDatabaseUrl", "InvalidDatabaseUrl"]
        finally:
            loop.cancel()

    run_on_a_manual_clock(kube, FakeDatabases(QueueDepth(0, 0)), scenario)

def test_a_deployment_owned_by_someone_else_is_left_alone():
    kube = FakeKube()
    kube.deployments["w-worker"] = {"metadata": {"name": "w-worker", "namespace": "ns", "annotations": {}}, "spec": {"replicas": 7}}
    result = tick(kube, QueueDepth(ready=100, running=0))
    assert conditions(result)["Ready"] == ("False", "DeploymentNotOwned")
    assert kube.scaled == [] and kube.deployments["w-worker"]["spec"] == {"replicas": 7}


def test_an_unusable_spec_is_reported_not_raised():
    result = tick(FakeKube(), QueueDepth(0, 0), {"queue": "q"})
    assert conditions(result)["Ready"] == ("False", "InvalidSpec")


@pytest.mark.parametrize("template", [
    {"spec": {"containers": "x"}}, {"metadata": {"labels": None}}, {"spec": {"terminationGracePeriodSeconds": "30s"}},
    {"spec": "x"}, {"metadata": None},
], ids=["containers-text", "labels-null", "grace-text", "spec-text", "metadata-null"])
def test_a_template_of_the_wrong_shape_is_an_invalid_spec_with_one_event(template):
    """Objects stored before the CRD typed `template` (the API server refuses these now)."""
    kube = FakeKube(replicas=2)
    result = tick(kube, QueueDepth(0, 0), {**SPEC, "template": template})
    assert conditions(result)["Ready"] == ("False", "InvalidSpec")
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "InvalidSpec")]
    assert kube.writes == 0 and kube.scaled == []
    again = tick(kube, QueueDepth(0, 0), {**SPEC, "template": template}, status=result.status)
    assert again.events == []  # one Event per change of reason, not one per tick


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_a_privileged_template_changes_no_deployment(case):
    kube = FakeKube(replicas=2)
    tick(kube, QueueDepth(0, 0))  # the Deployment as it was before the template changed
    writes = kube.writes
    result = tick(kube, QueueDepth(100, 0), {**SPEC, "template": case.template}, generation=2)
    ready = next(c for c in result.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert case.path in ready["message"]
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "InvalidSpec")]
    assert kube.writes == writes and kube.scaled == [0]  # the first tick's scale only


def test_privileged_templates_are_deployed_where_the_cluster_allows_them():
    kube = FakeKube()
    privileged = {"spec": {"hostNetwork": True, "containers": [{"name": "worker", "securityContext": {"privileged": True}}]}}
    result = tick(kube, QueueDepth(0, 0), {**SPEC, "template": privileged}, allow_privileged_templates=True)
    assert conditions(result)["Ready"] == ("True", "QueueReadable")
    assert kube.deployments["w-worker"]["spec"]["template"]["spec"]["hostNetwork"] is True


@pytest.mark.parametrize("field", ["serviceAccountName", "serviceAccount"])
def test_no_template_runs_as_the_controllers_own_service_account(field):
    as_controller = {**SPEC, "template": {"spec": {field: "controller"}}}
    for allow in (False, True):  # not a pod-security matter: no flag allows it
        kube = FakeKube()
        result = tick(kube, QueueDepth(3, 0), as_controller, service_account=("ns", "controller"),
                      allow_privileged_templates=allow)
        assert conditions(result)["Ready"] == ("False", "InvalidSpec")
        assert "controller is the controller's own ServiceAccount" in result.status["message"]
        assert kube.deployments == {} and kube.writes == 0
    elsewhere = tick(FakeKube(), QueueDepth(3, 0), as_controller, service_account=("qw-system", "controller"))
    assert conditions(elsewhere)["Ready"] == ("True", "QueueReadable"), "another namespace's account of that name"


class ExplodingKube(FakeKube):
    def list_pods(self, namespace, selector):
        raise RuntimeError("something nobody expected")

    def read_deployment(self, namespace, name):
        raise RuntimeError(f"boom while reading {self.secret}")


def test_any_error_in_a_tick_becomes_a_condition_an_event_and_a_scrubbed_log(caplog):
    kube = ExplodingKube()
    kube.secret = "postgresql://app:hunter2hunter2@db/app"
    memory = ObjectMemory()
    with caplog.at_level(logging.DEBUG, logger="queueworker_controller"):
        result = tick(kube, QueueDepth(0, 0), memory=memory)
    ready = next(c for c in result.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ReconcileError")
    assert "RuntimeError" in ready["message"] and "hunter2hunter2" not in ready["message"]
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "ReconcileError")]
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None  # the traceback is logged (the scrubbing filter masks it: test_redaction)
    assert memory.next_poll - memory.last_poll == SPEC["scaling"]["pollingIntervalSeconds"]  # polling goes on


@pytest.mark.parametrize(("secret", "message"), [
    (b"\xff\xfepostgresql://app:pw@db/app", "the Secret value is not UTF-8 text"),
    ("ghp_0123456789abcdefTOKENTOKENTOKEN", "not a valid Postgres connection string"),
    ("postgresq://app:Sup3rSecretPw@db/app", "scheme"),
    ("postgresql://app:Sup3rSecretPw@db/app\x00", "NUL byte"),
    ("x" * 1_000_000, "the Secret value is 1000000 bytes long"),
], ids=["not-utf8", "api-token", "scheme-typo", "nul-byte", "one-megabyte"])
def test_a_hostile_secret_value_is_classified_and_never_repeated(secret, message):
    kube = FakeKube(replicas=2)
    kube.secret = secret
    result = tick(kube, QueueDepth(0, 0))
    ready = next(c for c in result.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidDatabaseUrl")
    assert message in ready["message"] and "Secret ns/db key 'url'" in ready["message"]
    text = str(result.status) + " ".join(e.message for e in result.events)
    for fragment in ("Sup3rSecretPw", "TOKENTOKEN", "xxxxxxxxxx", "\\xff"):
        assert fragment not in text
    assert kube.scaled == [] and result.status["desiredReplicas"] == 2  # holds, as for a missing Secret


def test_database_errors_are_explained_without_the_url():
    kube = FakeKube(replicas=1)
    kube.secret = "postgresql://app:Sup3rSecretPw@db.example:5432/orders"
    error = psycopg.OperationalError('connection to server failed: FATAL:  password authentication failed for '
                                     'user "app" (postgresql://app:Sup3rSecretPw@db.example:5432/orders)')
    result = tick(kube, None, databases=FakeDatabases(None, error))
    ready = next(c for c in result.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "DatabaseUnreachable"
    assert 'password authentication failed for user "app"' in ready["message"]
    assert "user app at db.example:5432/orders" in ready["message"]
    assert "Sup3rSecretPw" not in str(result.status) + " ".join(e.message for e in result.events)


def test_a_rotated_secret_rolls_the_pods_and_an_outage_does_not():
    kube = FakeKube(replicas=1)
    tick(kube, QueueDepth(0, 0))
    assert secret_version(kube.deployments["w-worker"]) == "1"
    kube.secret, kube.secret_version = "postgresql://db2/app", "2"
    databases = FakeDatabases(QueueDepth(0, 0))
    tick(kube, QueueDepth(0, 0), databases=databases)
    assert secret_version(kube.deployments["w-worker"]) == "2"
    assert databases.bindings == {("ns", "w"): ("postgresql://db2/app", "jobs")}
    writes = kube.writes
    kube.secret = None  # deleted: the pods keep the version they run with
    tick(kube, QueueDepth(0, 0), databases=databases)
    assert kube.writes == writes
    assert databases.bindings == {}  # and the database it named is not kept open
    assert kube.deployments["w-worker"]["spec"]["template"]["metadata"]["annotations"][SECRET_VERSION_ANNOTATION] == "2"


def test_pods_that_cannot_be_created_show_in_a_condition_and_one_event():
    kube = FakeKube(replicas=1)
    first = tick(kube, QueueDepth(0, 1))
    assert conditions(first)["ReplicaFailure"] == ("False", "PodsCreated")
    kube.deployments["w-worker"]["status"] = {"conditions": [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
         "message": 'pods "w-worker-1" is forbidden: violates PodSecurity "restricted:latest"'}]}
    failing = tick(kube, QueueDepth(0, 1), status=first.status)
    assert conditions(failing)["ReplicaFailure"] == ("True", "FailedCreate")
    assert [(e.type, e.reason) for e in failing.events] == [("Warning", "FailedCreate")]
    assert "violates PodSecurity" in failing.events[0].message
    assert tick(kube, QueueDepth(0, 1), status={**first.status, **failing.status}).events == []


def test_deleting_a_queueworker_forgets_its_database_secret_and_metrics():
    databases = FakeDatabases(QueueDepth(3, 0))
    secrets = KnownSecrets()
    kube = FakeKube()
    kube.secret = "postgresql://app:pw-to-forget@db/app"
    reconciler = Reconciler(kube, databases, secrets=secrets)  # type: ignore[arg-type]
    obj = QueueWorkerObject("gone", "ns", "uid", 1, SPEC, {})

    async def scenario():
        await reconciler.tick(obj, ObjectMemory())
        metrics.errors.labels("ns", "gone", "DatabaseUnreachable").inc()
        assert databases.bindings and "pw-to-forget" in secrets.values()
        await reconciler.forget("ns", "gone")
    asyncio.run(scenario())
    reconciler.close()
    assert databases.bindings == {} and secrets.values() == []
    exported = [s for m, _ in metrics.PER_OBJECT for f in m.collect() for s in f.samples
                if s.labels.get("name") == "gone"]
    assert exported == []


def test_the_scale_down_window_survives_a_controller_restart():
    spec = {**SPEC, "scaling": {**SPEC["scaling"], "scaleDownStabilizationSeconds": 300, "cooldownSeconds": 300}}
    kube = FakeKube(replicas=5)
    busy = tick(kube, QueueDepth(ready=10, running=0), spec)
    assert busy.status["recommendations"][0]["replicas"] == 5
    after_restart = tick(kube, QueueDepth(ready=0, running=1), spec, status=busy.status, memory=ObjectMemory())
    assert kube.scaled == [] and after_restart.status["reason"] == "Stabilizing"


class StuckKube(FakeKube):
    def read_deployment(self, namespace, name):
        time.sleep(1)  # far longer than the tick may take here
        return None


def test_a_tick_that_never_ends_is_abandoned_and_reported(monkeypatch):
    monkeypatch.setattr(reconcile, "TICK_TIMEOUT_SECONDS", 0.2)
    result = tick(StuckKube(), QueueDepth(0, 0))
    ready = next(c for c in result.status["conditions"] if c["type"] == "Ready")
    assert (ready["reason"], ready["message"]) == ("ReconcileError", "the tick did not finish within 0.2s")
    assert [e.reason for e in result.events] == ["ReconcileError"]


@pytest.mark.parametrize(("listening", "depth", "wait"), [
    (True, QueueDepth(0, 0), 60), (False, QueueDepth(0, 0), 10), (True, QueueDepth(0, 0, retrying=2), 10),
    (True, QueueDepth(5, 0), 10)])
def test_an_idle_queueworker_waits_for_announcements_while_its_database_listens(listening, depth, wait):
    """Idle at zero with the LISTEN up: a NOTIFY wakes it, so it polls only every IDLE_POLL_SECONDS.
    Without the LISTEN, with retries to come or with work, it polls every pollingIntervalSeconds (10)."""
    clock = [100.0]
    databases = FakeDatabases(depth)
    databases.listens = listening
    reconciler = Reconciler(FakeKube(replicas=0), databases, secrets=KnownSecrets(),  # type: ignore[arg-type]
                            monotonic=lambda: clock[0])
    obj, memory = QueueWorkerObject("w", "ns", "uid", 1, SPEC, {}), ObjectMemory()
    try:
        asyncio.run(reconciler.tick(obj, memory))
        assert reconciler.seconds_until_due(obj, memory) == wait
    finally:
        reconciler.close()


def user_workload(args: list[str], grace: int | None = 60, scaled_by: str | None = "w") -> dict[str, Any]:
    """A workload of the user's own, opted in to be scaled by QueueWorker `scaled_by` (the ticks' "w")."""
    pod = {"containers": [{"name": "app", "image": "mine", "args": args}]}
    if grace is not None:
        pod["terminationGracePeriodSeconds"] = grace
    annotations = {} if scaled_by is None else {SCALED_BY_ANNOTATION: scaled_by}
    return {"metadata": {"name": "mine", "namespace": "ns", "annotations": annotations},
            "spec": {"template": {"spec": pod}}, "status": {"readyReplicas": 1}}


@pytest.mark.parametrize("scaled_by, unreadable, why", [
    (None, False, "it must opt in with the annotation queueworker.dev/scaled-by: w (it has none)"),
    ("other", False, "(it names 'other')"),
    ("w", True, "the controller may not read it, so cannot see its queueworker.dev/scaled-by annotation"),
], ids=["no-annotation", "another-queueworker", "unreadable"])
def test_a_scale_target_that_did_not_opt_in_is_never_scaled(scaled_by, unreadable, why):
    kube = FakeKube()
    kube.target = user_workload(["worker"], scaled_by=scaled_by)
    if unreadable:  # the controller may read its Scale but not the object (403 on get)
        kube.read_scale_target = lambda namespace, ref: FoundScaleTarget({"spec": {"replicas": 1}}, None)
    spec = {k: v for k, v in SPEC.items() if k != "image"} | {"scaleTargetRef": {"kind": "Deployment", "name": "mine"}}
    result = tick(kube, QueueDepth(ready=50, running=0), spec)
    assert conditions(result)["Ready"] == ("False", "ScaleTargetNotOptedIn")
    assert why in result.status["message"]
    assert kube.target_scaled == [] and kube.costs == {} and kube.writes == 0


def test_a_scale_target_is_scaled_through_its_scale_and_nothing_is_created():
    kube = FakeKube()
    kube.target = user_workload(["worker", "--queue", "jobs", "--drain-seconds", "30"])
    spec = {k: v for k, v in SPEC.items() if k != "image"} | {"scaleTargetRef": {"kind": "Deployment", "name": "mine"}}
    result = tick(kube, QueueDepth(ready=7, running=1), spec)
    assert kube.target_scaled == [("Deployment", "mine", 4)] and kube.writes == 0 and kube.deployments == {}
    assert result.status["scaleTarget"] == "Deployment/mine" and "deployment" not in result.status
    assert result.status["replicas"] == 4 and result.status["readyReplicas"] == 1
    assert conditions(result)["DrainSafe"] == ("True", "GracePeriodCoversDrain")
    kube.target = user_workload(["worker", "--drain-seconds=90"], grace=None)  # the default grace: 30 s
    assert conditions(tick(kube, QueueDepth(0, 4), spec))["DrainSafe"] == ("False", "GracePeriodTooShort")
    kube.target = user_workload(["python", "app.py"])
    assert conditions(tick(kube, QueueDepth(0, 4), spec))["DrainSafe"] == ("Unknown", "NotAQueueworkerPod")
    kube.target = None
    assert conditions(tick(kube, QueueDepth(0, 4), spec))["Ready"] == ("False", "ScaleTargetUnavailable")


@pytest.mark.parametrize("spec_change", [{"scaleTargetRef": {"kind": "Deployment", "name": "mine"}},
                                          {"image": None}], ids=["both", "neither"])
def test_image_or_scale_target_not_both(spec_change):
    spec = {k: v for k, v in {**SPEC, **spec_change}.items() if v is not None}
    assert conditions(tick(FakeKube(), QueueDepth(0, 0), spec))["Ready"][1] == "InvalidSpec"


@pytest.mark.parametrize("drain", ["nan", "inf", "1e400", "-inf", "\x00", "9" * 5000, ""])
def test_a_scale_targets_hostile_drain_flag_is_judged_unknown(drain):
    kube = FakeKube()
    kube.target = user_workload(["worker", "--drain-seconds", drain])
    spec = {k: v for k, v in SPEC.items() if k != "image"} | {"scaleTargetRef": {"kind": "Deployment", "name": "mine"}}
    result = tick(kube, QueueDepth(0, 1), spec)
    assert conditions(result)["DrainSafe"] == ("Unknown", "NotAQueueworkerPod")
    assert conditions(result)["Ready"][0] == "True"
