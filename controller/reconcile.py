"""One scaling tick of one QueueWorker: observe, decide, act, report.

Kept free of kopf: the operator hands in the object's fields and gets back a status patch and the
Events to post. `tick` never raises: whatever goes wrong becomes `Ready=False` with a reason, one
Warning Event when the reason changes, and the next tick comes at the usual interval (never a kopf
retry loop). Kubernetes calls run on a thread pool of their own; database reads are asyncio,
isolated per database (queuedb.py). Messages derived from a database error or a Secret value go
through `queueworker.dsn`, so no Secret value reaches a status field, an Event or a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypeVar

import psycopg
from kubernetes.client.rest import ApiException
from queueworker import dsn as dsn_text
from queueworker import tracing
from queueworker.events import DueTimer, wait_event
from queueworker.scaling.policy import Decision, PolicyInputs, QueueDepth, decide
from queueworker.scaling.resource import StatusField

from . import conditions, metrics, podsecurity
from .budget import ConnectionShares
from .connector import checked_params
from .deployment import (
    HASH_ANNOTATION, DeploymentCache, build_deployment, deployment_name, grace_period_seconds,
    secret_version, selector_labels,
)
from .kube import DELETION_COST_ANNOTATION, Kube, ScaleTargetUnavailable, SecretUnavailable, SecretValue, api_error
from .queuedb import QueueDatabases
from .redaction import KnownSecrets, known_secrets
from .scalein import deletion_costs
from .spec import SCALED_BY_ANNOTATION, InvalidSpec, QueueWorkerSpec
from .status import (
    MESSAGE_LIMIT, Event, TickResult, depth_status, epoch, failure, history, iso, recommendations, status_patch,
    tick_conditions,
)
from .workload import worker_drain, worker_processes

log = logging.getLogger(__name__)
T = TypeVar("T")

# A NOTIFY for the queue makes a tick due early, but not more often than this.
MIN_NOTIFIED_POLL_SECONDS = 1.0
# A QueueWorker idle at zero replicas, whose database's LISTEN connection is up, waits for a NOTIFY
# rather than polling: it polls only this often, as a safety net (rows written without the producer).
IDLE_POLL_SECONDS = 60
# A database Secret is read again after this long (a rotation is seen within it), or at once after
# the database could not be read with it.
SECRET_REFRESH_SECONDS = 30
# A spec that cannot be parsed is looked at again this often (a spec change is seen at once).
UNPARSABLE_SPEC_RETRY_SECONDS = 60
# The last guard: a tick still running after this long (every call in it has a shorter timeout of
# its own) is abandoned and reported, so no QueueWorker is ever stuck, nor its deletion.
TICK_TIMEOUT_SECONDS = 120
# Threads for Kubernetes calls (each bounded by kube.REQUEST_TIMEOUT); never used for database work.
KUBE_THREADS = 8
# A Secret value longer than this is no database URL; it is neither parsed nor kept in memory.
MAX_DATABASE_URL_BYTES = 8192


@dataclass(frozen=True)
class RenderedDeployment:
    """What a tick needs of the Deployment rendered for (generation, Secret version): rendering is
    repeated only when those change, or to write it; the object itself is not kept."""

    key: tuple[int, str | None]
    spec_hash: str
    grace: int
    refused: list[str]  # what pod security refuses in its template


@dataclass
class ObjectMemory:
    """What the controller remembers about one QueueWorker between ticks (lost on restart, harmless),
    and how its loop is woken: a NOTIFY for its queue (`notified`), or a change of its spec (`wake`)."""

    generation: int | None = None
    last_poll: float = float("-inf")  # monotonic
    next_poll: float = 0.0  # monotonic
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    notified_pending: bool = False  # tasks were announced as due since the last poll
    lookahead_seconds: float = 0.0  # tasks announced as due later are looked at this much earlier
    reread_secret: bool = False  # the last depth read failed: the next tick reads the Secret anew
    rendered: RenderedDeployment | None = field(default=None, repr=False)
    # The status fields written since the view of the object last showed the controller's writes.
    unseen_writes: dict[str, Any] | None = field(default=None, repr=False)
    _timer: DueTimer = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._timer = DueTimer(lambda: self.notified(0.0))

    def notified(self, due_epoch: float) -> None:
        """A NOTIFY announced tasks on the queue, due at `due_epoch` (0: now), looked at
        `lookahead_seconds` earlier. One timer at most, for the earliest announcement: the tick it
        causes reads every task due by then."""
        look_at = due_epoch - self.lookahead_seconds
        if look_at > time.time():
            self._timer.at(look_at)
            return
        self.notified_pending = True
        self.wake.set()

    @property
    def wake_at(self) -> float:
        """When the timer of announced tasks wakes the loop (epoch seconds), inf when it is not set."""
        return self._timer.due_at

    def stop_timer(self) -> None:
        self._timer.cancel()


class DeploymentNotOwned(Exception):
    """A Deployment with the worker Deployment's name belongs to someone else."""


@dataclass(frozen=True)
class ScaledTarget:
    """What a tick scales: the owned worker Deployment, or the resource `spec.scaleTargetRef` names."""

    name: str  # for status: the Deployment's name, or Kind/name of a scale target
    replicas: int
    ready_replicas: int
    workload: dict[str, Any]  # the object itself (its conditions, its pod template), {} when unknown
    scale: Callable[[int], None]  # blocking: runs on the Kubernetes threads
    pod_selector: str  # label selector of its pods, for lease-aware scale-in ("" when unknown)
    grace: int | None  # the pods' terminationGracePeriodSeconds and the worker's drain, when known
    drain: int | None
    processes: int = 1  # worker processes per pod: the connections a replica holds


@dataclass(frozen=True)
class QueueWorkerObject:
    name: str
    namespace: str
    uid: str
    generation: int
    spec: dict[str, Any]
    status: dict[str, Any]

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name


@dataclass(frozen=True)
class DatabaseSecret:
    """What the database Secret gave: a usable URL and the Secret's version, or why not."""

    dsn: str | None = field(default=None, repr=False)
    version: str | None = None
    error_reason: str | None = None
    error: str | None = None


class SecretRead(NamedTuple):
    """A Secret read, kept for the QueueWorkers that share the Secret."""

    read_at: float  # monotonic
    value: SecretValue
    parsed: DatabaseSecret


def database_url(raw: bytes) -> str:
    """The Postgres URL in a Secret's raw value; InvalidDsn (a message without the value) otherwise."""
    if len(raw) > MAX_DATABASE_URL_BYTES:
        raise dsn_text.InvalidDsn(f"the Secret value is {len(raw)} bytes long; a database URL is at most "
                                  f"{MAX_DATABASE_URL_BYTES}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise dsn_text.InvalidDsn("the Secret value is not UTF-8 text") from None
    checked_params(text)  # a URL, and one asking only for what a tenant may (controller/connector.py)
    return text


def with_written_status(obj: QueueWorkerObject, memory: ObjectMemory) -> QueueWorkerObject:
    """The object with the status fields the controller wrote on top, until its view shows them.
    The view (kopf's, fed by a watch) brings a status write back only when the watch delivers it,
    which on a loaded API server can be after the next tick; a tick computed from the older status
    would announce a changed reason a second time (a duplicate Warning Event) and leave unwritten a
    field that changed back. Nobody else writes a QueueWorker's status, and a process that loses
    the lead stops, so what it wrote last is what the API server holds."""
    unseen = memory.unseen_writes
    if unseen is None:
        return obj
    if all(obj.status.get(key) == value for key, value in unseen.items()):
        memory.unseen_writes = None
        return obj
    return replace(obj, status={**obj.status, **unseen})


class Reconciler:
    """Ticks QueueWorkers. Time comes from `wall_clock` (epoch seconds, for the status and the
    policy) and `monotonic` (for polling), and a loop sleeps with `wait` (an Event and a timeout:
    True once the Event is set): tests give their own, so that time moves when they say."""

    def __init__(self, kube: Kube, databases: QueueDatabases, *, allow_privileged_templates: bool = False,
                 service_account: tuple[str, str] | None = None,
                 secrets: KnownSecrets = known_secrets, wall_clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 wait: Callable[[asyncio.Event, float], Awaitable[bool]] = wait_event):
        self.kube = kube
        self.databases = databases
        self.shares = ConnectionShares()  # the database's connection budget, shared by its QueueWorkers
        self.deployments = DeploymentCache()
        # (namespace, Secret, key) -> its last read: QueueWorkers sharing a Secret share a read.
        self._secret_reads: dict[tuple[str, str, str], SecretRead] = {}
        self.allow_privileged_templates = allow_privileged_templates
        self.service_account = service_account  # (namespace, name) the controller itself runs as
        self.secrets = secrets
        self.wall_clock = wall_clock
        self.monotonic = monotonic
        self.wait = wait
        self._kube_threads = ThreadPoolExecutor(KUBE_THREADS, thread_name_prefix="kube")

    def seconds_until_due(self, obj: QueueWorkerObject, memory: ObjectMemory) -> float:
        """0 when a tick is due: the spec changed, or the polling interval has passed, or tasks were
        announced since the last poll (then at most once per MIN_NOTIFIED_POLL_SECONDS)."""
        now = self.monotonic()
        if obj.generation != memory.generation:
            return 0.0
        due = memory.next_poll
        if memory.notified_pending:
            due = min(due, memory.last_poll + MIN_NOTIFIED_POLL_SECONDS)
        return max(0.0, due - now)

    async def run(self, current: Callable[[], QueueWorkerObject], memory: ObjectMemory,
                  publish: Callable[[QueueWorkerObject, TickResult], Awaitable[None]],
                  stopping: Callable[[], bool] = lambda: False) -> None:
        """One QueueWorker's loop, for as long as it exists (a kopf daemon; cancelled on deletion):
        tick when due, and otherwise sleep until the next poll, a NOTIFY for its queue or a change
        of its spec, whichever comes first. An idle QueueWorker costs nothing between its polls.
        `current()` gives the object as it is now; `publish` writes a tick's status and Events;
        once `stopping()` (its waker sets `memory.wake`), the loop ends between ticks.
        Supervised: an error in `publish` is logged, and the loop goes on at the next poll."""
        try:
            while not stopping():
                memory.wake.clear()
                obj = with_written_status(current(), memory)
                seconds = self.seconds_until_due(obj, memory)
                if seconds > 0:
                    await self.wait(memory.wake, seconds)
                    continue
                memory.notified_pending = False
                result = await self.tick(obj, memory)
                try:
                    await publish(obj, result)
                except Exception as exc:  # noqa: BLE001 - the next poll writes the status again
                    log.warning("%s/%s: could not write the status: %s", obj.namespace, obj.name,
                                self.secrets.scrub(_first_line(exc)))
                else:
                    if result.status:
                        memory.unseen_writes = {**(memory.unseen_writes or {}), **result.status}
        finally:
            memory.stop_timer()

    async def write_status(self, obj: QueueWorkerObject, status: dict[str, Any]) -> None:
        """A merge patch of the status subresource (only what changed: see _status_patch)."""
        if status:
            await self._kube(self.kube.patch_status, obj.namespace, obj.name, status)

    async def tick(self, obj: QueueWorkerObject, memory: ObjectMemory) -> TickResult:
        """One tick, in a span of its own when tracing is installed (queueworker.tracing); never
        raises (but for cancellation)."""
        with tracing.controller_tick_span(obj.namespace, obj.name):
            return await self._guarded_tick(obj, memory)

    async def _guarded_tick(self, obj: QueueWorkerObject, memory: ObjectMemory) -> TickResult:
        started = self.monotonic()
        memory.generation = obj.generation
        memory.next_poll = started + UNPARSABLE_SPEC_RETRY_SECONDS
        deadline = asyncio.timeout(TICK_TIMEOUT_SECONDS)
        try:
            async with deadline:
                return await self._tick(obj, memory, started)
        except Exception as exc:  # noqa: BLE001 - the handler boundary: report, never retry-loop
            if deadline.expired():
                return self._failed(obj, "ReconcileError", f"the tick did not finish within {TICK_TIMEOUT_SECONDS}s")
            return self._failed(obj, "ReconcileError", f"the tick failed: {type(exc).__name__}: "
                                f"{self.secrets.scrub(_first_line(exc))}", exc)
        finally:
            metrics.tick_seconds.observe(self.monotonic() - started)

    async def forget(self, namespace: str, name: str) -> None:
        """A QueueWorker was deleted: drop what the controller kept for it (database binding, known
        Secret value, metrics series). Its Deployment goes with it (owner reference)."""
        self.databases.release((namespace, name))
        self.shares.release((namespace, name))
        metrics.databases.set(self.databases.open_databases)
        self.secrets.forget((namespace, name))
        metrics.forget(namespace, name)

    def close(self) -> None:
        self.databases.close()
        self._kube_threads.shutdown(wait=False, cancel_futures=True)

    async def _kube(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._kube_threads, functools.partial(call, *args))

    async def _tick(self, obj: QueueWorkerObject, memory: ObjectMemory, started: float) -> TickResult:
        try:
            spec = QueueWorkerSpec.from_dict(obj.spec)
        except InvalidSpec as exc:
            return self._failed(obj, "InvalidSpec", f"spec cannot be used: {exc}")
        memory.last_poll = started
        memory.next_poll = started + spec.scaling.polling_interval_seconds
        now = self.wall_clock()

        secret = await self._read_secret(obj, spec, fresh=memory.reread_secret)
        target = await (self._owned_deployment(obj, spec, secret, memory) if spec.scale_target is None else
                        self._external_target(obj, spec))
        if isinstance(target, TickResult):
            return target
        current_replicas = target.replicas

        depth, error_reason, error = None, secret.error_reason, secret.error
        if secret.dsn is not None:
            depth, error_reason, error = await self._read_depth(obj, spec, secret.dsn, memory)
        else:  # the Secret names no database now: the one it named is not kept open for it
            self.databases.release(obj.key)
            self.shares.release(obj.key)
            metrics.databases.set(self.databases.open_databases)
        memory.reread_secret = depth is None  # the Secret may have changed (a rotation): read it again
        if error_reason:
            metrics.errors.labels(obj.namespace, obj.name, error_reason).inc()
        previous = obj.status
        params = spec.scaling_params(worker_processes=target.processes)
        if depth is not None and secret.dsn is not None:  # shares are taken in turn: no await until `hold`
            depth = self.shares.with_budget(secret.dsn, obj.key, depth, spec.max_connections)
        decision = decide(PolicyInputs(params, current_replicas, depth, now, history(previous),
                                       epoch(previous.get(StatusField.LAST_ACTIVE_TIME)), error))
        events: list[Event] = []
        desired = current_replicas if spec.scaling.paused else decision.desired_replicas
        if secret.dsn is not None and params.connections_per_replica is not None:  # a dry run scales nothing
            self.shares.hold(secret.dsn, obj.key, max(current_replicas, current_replicas if spec.scaling.dry_run
                                                      else desired) * params.connections_per_replica)
        tracing.annotate_current({"queueworker.decision": "Paused" if spec.scaling.paused else decision.reason,
                                  "queueworker.replicas.current": current_replicas,
                                  "queueworker.replicas.desired": desired})
        replicas, last_scale = current_replicas, previous.get(StatusField.LAST_SCALE_TIME)
        if desired != current_replicas and not spec.scaling.paused and not spec.scaling.dry_run:
            try:
                if desired < current_replicas and secret.dsn is not None:
                    await self._price_pods(obj, spec, secret.dsn, target.pod_selector)
                await self._kube(target.scale, desired)
                if spec.scale_target is None:
                    self.deployments.set_replicas(obj.namespace, target.name, desired)
            except ApiException as exc:
                self.deployments.drop(obj.namespace, deployment_name(obj.name))
                return self._failed(obj, "ScaleFailed", f"scaling {current_replicas} -> {desired}: {api_error(exc)}")
            replicas, last_scale = desired, iso(now)
            metrics.scales.labels(obj.namespace, obj.name, "up" if desired > current_replicas else "down").inc()
            events.append(Event("Normal", decision.reason, decision.message))
            log.info("%s/%s: %s: %s", obj.namespace, obj.name, decision.reason, decision.message)
        elif (desired != current_replicas and spec.scaling.dry_run
              and desired != previous.get(StatusField.DESIRED_REPLICAS)):
            events.append(Event("Normal", "DryRun", f"would scale: {decision.message}"))

        if (decision.reason == "Idle" and depth is not None and depth.retrying == 0 and secret.dsn is not None
                and self.databases.listening(secret.dsn)):
            # Nothing to do, and any task a producer enqueues is announced: wait for that instead.
            memory.next_poll = started + max(spec.scaling.polling_interval_seconds, IDLE_POLL_SECONDS)
        was = previous.get(StatusField.CONDITIONS)
        new_conditions, condition_events = tick_conditions(spec, decision, error_reason, target.workload,
                                                           target.grace, target.drain, was)
        events += condition_events
        status: dict[str, Any] = {
            StatusField.OBSERVED_GENERATION: obj.generation,
            (StatusField.DEPLOYMENT if spec.scale_target is None else StatusField.SCALE_TARGET): target.name,
            StatusField.REPLICAS: replicas,
            StatusField.DESIRED_REPLICAS: desired,
            StatusField.READY_REPLICAS: target.ready_replicas,
            StatusField.TASKS_PER_REPLICA: spec.tasks_per_replica,
            StatusField.LAST_POLL_TIME: iso(now),
            StatusField.LAST_SCALE_TIME: last_scale,
            StatusField.LAST_ACTIVE_TIME: iso(decision.last_active_time) if decision.last_active_time else None,
            StatusField.REASON: "Paused" if spec.scaling.paused else decision.reason,
            StatusField.MESSAGE: decision.message[:MESSAGE_LIMIT],
            StatusField.RECOMMENDATIONS: recommendations(decision.history),
            StatusField.CONDITIONS: conditions.render(new_conditions, was, obj.generation, iso(now)),
        }
        if depth is not None:
            status[StatusField.QUEUE_DEPTH] = depth_status(depth)
        _export(obj, decision, desired, replicas, depth)
        return TickResult(status_patch(previous, status, now, obj.uid), events)

    async def _read_secret(self, obj: QueueWorkerObject, spec: QueueWorkerSpec, fresh: bool) -> DatabaseSecret:
        """The database URL from the Secret, validated; errors carry secret-free messages. A read
        younger than SECRET_REFRESH_SECONDS is used again, unless `fresh`."""
        where = f"Secret {obj.namespace}/{spec.secret_name} key {spec.secret_key!r}"
        key = (obj.namespace, spec.secret_name, spec.secret_key)
        now = self.monotonic()
        cached = self._secret_reads.get(key)
        if cached is not None and not fresh and now - cached.read_at < SECRET_REFRESH_SECONDS:
            value, parsed = cached.value, cached.parsed
        else:
            try:
                value = await self._kube(self.kube.read_secret, obj.namespace, spec.secret_name, spec.secret_key)
            except SecretUnavailable as exc:
                self._secret_reads.pop(key, None)
                return DatabaseSecret(error_reason="SecretUnavailable", error=str(exc))
            except ApiException as exc:
                self._secret_reads.pop(key, None)
                return DatabaseSecret(error_reason="SecretUnavailable", error=f"{where}: {api_error(exc)}")
            parsed = _database_secret(value, where)
            self._remember_secret_read(key, now, value, parsed)
        if len(value.data) <= MAX_DATABASE_URL_BYTES:  # masked in logs from now on (memory stays bounded)
            self.secrets.remember(obj.key, value.data.decode("utf-8", "replace"))
        return parsed

    async def _owned_deployment(self, obj: QueueWorkerObject, spec: QueueWorkerSpec, secret: DatabaseSecret,
                                memory: ObjectMemory) -> ScaledTarget | TickResult:
        """The worker Deployment this QueueWorker owns, created or brought up to date with the spec."""
        name = deployment_name(obj.name)
        current = self.deployments.get(obj.namespace, name)
        if current is None:
            try:
                current = await self._kube(self.kube.read_deployment, obj.namespace, name)
            except ApiException as exc:
                return self._failed(obj, "DeploymentError", f"worker Deployment: {api_error(exc)}")
            if current is not None:
                current = self.deployments.put_fetched(current, based_on=None)
        # Without a usable URL (Secret missing or invalid), keep the version the pods run with:
        # they keep working with the value they started with; rolling them would break them.
        version = secret.version if secret.dsn is not None else secret_version(current)
        rendered = None
        if memory.rendered is None or memory.rendered.key != (obj.generation, version):
            try:
                rendered = build_deployment(obj.name, obj.namespace, obj.uid, spec, version)
            except InvalidSpec as exc:
                return self._failed(obj, "InvalidSpec", f"spec cannot be used: {exc}")
            refused = [] if self.allow_privileged_templates else podsecurity.violations(rendered["spec"]["template"])
            refused += self._runs_as_controller(obj.namespace, rendered["spec"]["template"])
            memory.rendered = RenderedDeployment((obj.generation, version),
                                                 rendered["metadata"]["annotations"][HASH_ANNOTATION],
                                                 grace_period_seconds(rendered), refused)
        summary = memory.rendered
        if summary.refused:
            return self._failed(obj, "InvalidSpec", _refusal(summary.refused))
        try:
            if _up_to_date(current, summary.spec_hash, obj.uid):  # the usual tick: nothing to write, no thread hop
                deployment = current
            else:
                rendered = rendered or build_deployment(obj.name, obj.namespace, obj.uid, spec, version)
                written = await self._kube(self._ensure_deployment, current, rendered, obj.uid, spec)
                deployment = self.deployments.put_fetched(written, based_on=current)
        except ApiException as exc:
            self.deployments.drop(obj.namespace, name)  # e.g. a conflict: the next tick reads it again
            return self._failed(obj, "DeploymentError", f"worker Deployment: {api_error(exc)}")
        except DeploymentNotOwned as exc:
            return self._failed(obj, "DeploymentNotOwned", str(exc))

        def scale(replicas: int) -> None:
            self.kube.scale_deployment(obj.namespace, name, replicas)
        return ScaledTarget(name, int(deployment["spec"].get("replicas", 1)),
                            int((deployment.get("status") or {}).get("readyReplicas") or 0), deployment, scale,
                            ",".join(f"{k}={v}" for k, v in selector_labels(obj.name).items()),
                            summary.grace, spec.drain_budget_seconds)

    async def _external_target(self, obj: QueueWorkerObject, spec: QueueWorkerSpec) -> ScaledTarget | TickResult:
        """`spec.scaleTargetRef`: read (and later scaled) through its `scale` subresource only; nothing
        else on it is ever changed. Its pods' drain safety is judged where they run our worker."""
        ref = spec.scale_target
        assert ref is not None
        where = f"{ref.kind} {obj.namespace}/{ref.name} ({ref.api_version})"
        try:
            found = await self._kube(self.kube.read_scale_target, obj.namespace, ref)
        except (ApiException, ScaleTargetUnavailable) as exc:
            why = api_error(exc) if isinstance(exc, ApiException) else str(exc)
            return self._failed(obj, "ScaleTargetUnavailable", f"scaleTargetRef {where}: {why}")
        refusal = _not_opted_in(found.workload, obj.name)
        if refusal:
            return self._failed(obj, "ScaleTargetNotOptedIn", f"scaleTargetRef {where}: {refusal}")
        scale_status = found.scale.get("status") or {}
        workload = found.workload or {}
        grace, drain = worker_drain(workload)

        def scale(replicas: int) -> None:
            self.kube.scale_target(obj.namespace, ref, replicas)
        return ScaledTarget(f"{ref.kind}/{ref.name}", int((found.scale.get("spec") or {}).get("replicas") or 0),
                            int((workload.get("status") or {}).get("readyReplicas")
                                or scale_status.get("replicas") or 0),
                            workload, scale, str(scale_status.get("selector") or ""), grace, drain,
                            worker_processes(workload))

    def _runs_as_controller(self, namespace: str, template: dict[str, Any]) -> list[str]:
        """A pod template that would run as the controller's own ServiceAccount (possible in the
        controller's namespace) would hand its rights to whoever may create a QueueWorker there:
        refused even with --allow-privileged-templates."""
        if self.service_account is None or namespace != self.service_account[0]:
            return []
        pod = template.get("spec") or {}
        name = self.service_account[1]
        if name in (pod.get("serviceAccountName"), pod.get("serviceAccount")):
            return [f"spec.template.spec.serviceAccountName: {name} is the controller's own ServiceAccount"]
        return []

    def _remember_secret_read(self, key: tuple[str, str, str], now: float, value: SecretValue,
                              parsed: DatabaseSecret) -> None:
        """Keeps a read (and what it gave) for the QueueWorkers sharing the Secret; reads past their
        time are dropped whenever another read is made."""
        self._secret_reads = {k: read for k, read in self._secret_reads.items()
                              if now - read.read_at < SECRET_REFRESH_SECONDS}
        self._secret_reads[key] = SecretRead(now, value, parsed)

    async def _read_depth(self, obj: QueueWorkerObject, spec: QueueWorkerSpec, dsn: str, memory: ObjectMemory
                          ) -> tuple[QueueDepth | None, str | None, str | None]:
        """(depth, error reason, error message); depth is None when it could not be read."""
        self.databases.bind(obj.key, dsn, spec.queue, memory.notified)
        metrics.databases.set(self.databases.open_databases)
        memory.lookahead_seconds = float(spec.scaling.lookahead_seconds or 0)
        # Enough to ask for maxReplicas, and to see that there is more than that.
        cap = spec.scaling.max_replicas * spec.tasks_per_replica + 1
        try:
            return await self.databases.depth(dsn, spec.queue, cap, spec.scaling.lookahead_seconds,
                                              spec.scaling.throughput_floor), None, None
        except psycopg.Error as exc:
            return None, "DatabaseUnreachable", (f"cannot read queue {spec.queue!r} ({dsn_text.describe(dsn)}): "
                                                 f"{dsn_text.explain(exc, dsn)}")

    def _ensure_deployment(self, current: dict[str, Any] | None, rendered: dict[str, Any], uid: str,
                           spec: QueueWorkerSpec) -> dict[str, Any]:
        """The worker Deployment, created (at minReplicas, within maxConnections) or updated when its
        rendering changed. A same-named Deployment this QueueWorker does not control is left alone."""
        meta = rendered["metadata"]
        if current is None:
            return self.kube.create_deployment(meta["namespace"], rendered, spec.initial_replicas)
        if not _controlled_by(current, uid):
            raise DeploymentNotOwned(f"Deployment {meta['namespace']}/{meta['name']} exists and is not controlled "
                                     f"by this QueueWorker; rename or delete it")
        if not _up_to_date(current, rendered["metadata"]["annotations"][HASH_ANNOTATION], uid):
            return self.kube.update_deployment(current, rendered)
        return current

    async def _price_pods(self, obj: QueueWorkerObject, spec: QueueWorkerSpec, dsn: str, selector: str) -> None:
        """Best effort: a failure here must not block the scale-down, only make its victims random."""
        if not selector:
            return
        try:
            leases = await self.databases.worker_leases(dsn, obj.namespace, spec.queue)
            pods = await self._kube(self.kube.list_pods, obj.namespace, selector)
            costs = deletion_costs([p["metadata"]["name"] for p in pods], leases)
            for pod in pods:
                meta = pod["metadata"]
                cost = str(costs[meta["name"]])
                if (meta.get("annotations") or {}).get(DELETION_COST_ANNOTATION) != cost:
                    await self._kube(self.kube.set_deletion_cost, obj.namespace, meta["name"], int(cost))
        except ApiException as exc:
            log.warning("could not set pod deletion costs for %s/%s: %s", obj.namespace, obj.name, api_error(exc))
        except psycopg.Error as exc:
            log.warning("could not set pod deletion costs for %s/%s: %s", obj.namespace, obj.name,
                        dsn_text.explain(exc, dsn))

    def _failed(self, obj: QueueWorkerObject, reason: str, message: str, exc: BaseException | None = None
                ) -> TickResult:
        """A tick that could not complete (status.failure). The Warning Event and the log line (with
        the traceback of an unexpected error) come once per change of reason, not once per tick."""
        message = message[:MESSAGE_LIMIT]
        metrics.errors.labels(obj.namespace, obj.name, reason).inc()
        tracing.annotate_current({"queueworker.decision": reason})
        result = failure(obj.status, obj.generation, reason, message, self.wall_clock())
        changed = bool(result.events)
        log.log(logging.ERROR if exc is not None and changed else logging.WARNING if changed else logging.DEBUG,
                "%s/%s: %s: %s", obj.namespace, obj.name, reason, message, exc_info=exc)
        return result


def _controlled_by(deployment: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid and ref.get("controller")
               for ref in deployment["metadata"].get("ownerReferences") or [])


def _up_to_date(current: dict[str, Any] | None, spec_hash: str, uid: str) -> bool:
    """The Deployment exists, is this QueueWorker's, and was rendered from the same spec."""
    return (current is not None and _controlled_by(current, uid)
            and (current["metadata"].get("annotations") or {}).get(HASH_ANNOTATION) == spec_hash)


def _database_secret(value: SecretValue, where: str) -> DatabaseSecret:
    """The URL a Secret value holds, validated."""
    try:
        return DatabaseSecret(dsn=database_url(value.data), version=value.version)
    except dsn_text.InvalidDsn as exc:
        return DatabaseSecret(version=value.version, error_reason="InvalidDatabaseUrl", error=f"{where}: {exc}")


def _not_opted_in(workload: dict[str, Any] | None, name: str) -> str | None:
    """Why a scaleTargetRef's workload may not be scaled by QueueWorker `name`; None when it names it
    in its SCALED_BY_ANNOTATION."""
    if workload is None:
        return (f"the controller may not read it, so cannot see its {SCALED_BY_ANNOTATION} annotation "
                f"(allow get on it)")
    found = ((workload.get("metadata") or {}).get("annotations") or {}).get(SCALED_BY_ANNOTATION)
    if found == name:
        return None
    has = "has none" if found is None else f"names {str(found)[:63]!r}"
    return f"it must opt in with the annotation {SCALED_BY_ANNOTATION}: {name} (it {has})"


def _refusal(violations: list[str]) -> str:
    shown = "; ".join(violations[:5]) + (f"; and {len(violations) - 5} more" if len(violations) > 5 else "")
    return (f"the pod template asks for privileges a QueueWorker may not grant: {shown} (pod-security ones are "
            f"allowed only where the controller runs with --allow-privileged-templates)")
















def _export(obj: QueueWorkerObject, decision: Decision, desired: int, replicas: int, depth: QueueDepth | None) -> None:
    labels = (obj.namespace, obj.name)
    metrics.decisions.labels(*labels, decision.reason).inc()
    metrics.desired_replicas.labels(*labels).set(desired)
    metrics.replicas.labels(*labels).set(replicas)
    if depth is not None:
        for state in ("ready", "running", "retrying", "blocked"):
            metrics.queue_depth.labels(*labels, state).set(getattr(depth, state))
        _export_keys(labels, depth)


def _export_keys(labels: tuple[str, str], depth: QueueDepth) -> None:
    """The keys' gauges of a queue with per-key limits; none for others (removed when the limits go)."""
    keyed = depth.key_limited
    for gauge, extra, value in ((metrics.queue_keys, ("ready",), depth.keys_ready if keyed else None),
                                (metrics.queue_keys, ("held",), depth.keys_held if keyed else None),
                                (metrics.key_slots, (), depth.key_slots)):
        if value is None:
            with contextlib.suppress(KeyError):
                gauge.remove(*labels, *extra)
        else:
            gauge.labels(*labels, *extra).set(value)


def _first_line(exc: BaseException) -> str:
    first, *_ = str(exc).strip().splitlines() or [type(exc).__name__]
    return first
