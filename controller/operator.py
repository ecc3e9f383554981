"""The kopf handlers: thin adapters from kopf's callbacks to the Reconciler.

One daemon per QueueWorker runs `Reconciler.run`: it ticks when the object's
`pollingIntervalSeconds` has passed, a NOTIFY announced tasks on its queue, or its spec changed,
and sleeps in between, so a quiet QueueWorker costs nothing between polls (a kopf timer would run
a handler on a fixed short interval for every object just to ask whether a tick is due). The
status is written by the Reconciler as a merge patch of what changed; Events go through
kopf.event. `Reconciler.tick` never raises, so kopf's retry-with-backoff never runs: errors are
conditions.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from queueworker.scaling.resource import GROUP, PLURAL, VERSION

from .deployment import OWNER_LABEL
from .kube import Kube, load_config
from .leader import LeaderElector
from .queuedb import QueueDatabases
from .reconcile import ObjectMemory, QueueWorkerObject, Reconciler
from .status import TickResult

MEMORY_KEY = "queueworker_memory"
# Objects whose watch events kopf processes at the same time (each may make API requests).
EVENT_WORKERS = 32
# A deleted QueueWorker's daemon is cancelled (kopf waits this long for it to end).
DAEMON_CANCELLATION_SECONDS = 10
# kopf's own API requests (watches have their own timeouts below).
API_REQUEST_TIMEOUT_SECONDS = 30
API_CONNECT_TIMEOUT_SECONDS = 10
WATCH_SERVER_TIMEOUT_SECONDS = 300
# How often kopf looks whether a deleted QueueWorker's daemon has ended (its default, 60 s, would
# hold every deletion that meets a tick in progress for a minute).
DAEMON_STOP_POLLING_SECONDS = 1


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    # Events come from the reconciler only (kopf.event); log records are never posted as Events.
    settings.posting.loggers = False
    settings.posting.level = logging.WARNING
    settings.networking.request_timeout = API_REQUEST_TIMEOUT_SECONDS
    settings.networking.connect_timeout = API_CONNECT_TIMEOUT_SECONDS
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_SECONDS
    settings.watching.client_timeout = WATCH_SERVER_TIMEOUT_SECONDS + API_REQUEST_TIMEOUT_SECONDS
    settings.background.cancellation_polling = DAEMON_STOP_POLLING_SECONDS
    # kopf's HTTP client opens a connection (with a 256 kB TLS read buffer) per concurrent request:
    # bounding the objects processed at once bounds that when a thousand QueueWorkers appear together.
    settings.queueing.worker_limit = EVENT_WORKERS
    kube = memo.get("kube") or Kube(load_config())  # built by the CLI when it elects a leader
    memo.reconciler = Reconciler(kube, QueueDatabases(),
                                 allow_privileged_templates=bool(memo.get("allow_privileged_templates")),
                                 service_account=memo.get("service_account"))


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    memo.reconciler.close()


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=DAEMON_CANCELLATION_SECONDS)
async def scaling_loop(name: str, namespace: str, body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped,
                       **_: Any) -> None:
    """Runs for as long as the QueueWorker exists (`stopped` once it is deleted or the operator
    stops: the loop then ends between ticks); `body` is kopf's live view of it."""
    reconciler: Reconciler = memo.reconciler
    memory: ObjectMemory = memo.setdefault(MEMORY_KEY, ObjectMemory())
    leader: LeaderElector | None = memo.get("leader")

    def current() -> QueueWorkerObject:
        meta = body.meta
        return QueueWorkerObject(name, namespace, meta["uid"], int(meta.get("generation", 0)), dict(body.spec),
                                 dict(body.status))

    async def publish(obj: QueueWorkerObject, result: TickResult) -> None:
        await reconciler.write_status(obj, result.status)  # checks the lead itself, as every write
        if leader is not None:
            leader.ensure_leading()
        for event in result.events:
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)

    async def wake_when_stopped() -> None:
        await stopped.wait()
        memory.wake.set()

    watcher = asyncio.create_task(wake_when_stopped())
    try:
        await reconciler.run(current, memory, publish, stopping=lambda: bool(stopped))
    finally:
        watcher.cancel()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def wake_on_spec_change(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A new generation (a spec change) is acted on at once, not at the next poll."""
    memory: ObjectMemory | None = memo.get(MEMORY_KEY)
    if memory is not None and body.meta.get("generation") != memory.generation:
        memory.wake.set()


@kopf.on.event("apps", "v1", "deployments", labels={OWNER_LABEL: kopf.PRESENT})
async def remember_deployment(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The watch of the worker Deployments feeds the reconciler's cache: ticks read no Deployment."""
    reconciler: Reconciler | None = memo.get("reconciler")
    if reconciler is None:
        return
    if event.get("type") == "DELETED":
        reconciler.deployments.drop(body.metadata.namespace, body.metadata.name)
    else:
        reconciler.deployments.put(dict(body))  # the cache copies what it keeps


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
async def forget(name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    """The Deployment goes with its owner (garbage collection); the controller's own state goes here."""
    await memo.reconciler.forget(namespace, name)
