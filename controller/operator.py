"""The kopf handlers: thin adapters from kopf's callbacks to the Reconciler.

One timer per QueueWorker fires every TICK_SECONDS; it does real work only when the object's
`pollingIntervalSeconds` has passed or its spec changed (kopf timers have a fixed interval, so the
per-object interval is checked here). Status goes through `patch.status`, never return values.
`Reconciler.tick` never raises, so kopf's retry-with-backoff never runs: errors are conditions.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from .kube import Kube, load_config
from .leader import LeaderElector
from .queuedb import QueueDatabases
from .reconcile import ObjectMemory, QueueWorkerObject, Reconciler
from .spec import GROUP, PLURAL, VERSION

TICK_SECONDS = 0.5
MEMORY_KEY = "queueworker_memory"
# The event loop's default executor does the DNS lookups of database connects (psycopg's async
# connect); enough threads that a few unresolvable hosts cannot hold up the rest.
RESOLVER_THREADS = 32
# kopf's own API requests (watches have their own timeouts below).
API_REQUEST_TIMEOUT_SECONDS = 30
API_CONNECT_TIMEOUT_SECONDS = 10
WATCH_SERVER_TIMEOUT_SECONDS = 300
# A deleted QueueWorker's timer stops after its running tick; kopf looks again this often (its
# default, 60 s, would hold every deletion that meets a tick in progress for a minute).
TIMER_STOP_POLLING_SECONDS = 1


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
    settings.background.cancellation_polling = TIMER_STOP_POLLING_SECONDS
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="resolve"))
    leader: LeaderElector | None = memo.get("leader")
    kube = Kube(load_config()) if leader is None else Kube(load_config(), before_write=leader.ensure_leading)
    memo.reconciler = Reconciler(kube, QueueDatabases(),
                                 allow_privileged_templates=bool(memo.get("allow_privileged_templates")))


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    memo.reconciler.close()


@kopf.timer(GROUP, VERSION, PLURAL, interval=TICK_SECONDS, backoff=TICK_SECONDS * 4)
async def scaling_tick(name: str, namespace: str, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status,
                       body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    reconciler: Reconciler = memo.reconciler
    memory: ObjectMemory = memo.setdefault(MEMORY_KEY, ObjectMemory())
    obj = QueueWorkerObject(name, namespace, meta["uid"], int(meta.get("generation", 0)), dict(spec), dict(status))
    if not reconciler.due(obj, memory):
        return
    result = await reconciler.tick(obj, memory)
    if memo.get("leader") is not None:  # kopf writes the status after we return
        memo.leader.ensure_leading()
    patch.status.update(result.status)
    for event in result.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
async def forget(name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    """The Deployment goes with its owner (garbage collection); the controller's own state goes here."""
    await memo.reconciler.forget(namespace, name)
