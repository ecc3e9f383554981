"""The kopf handlers: thin adapters from kopf's callbacks to the Reconciler.

One timer per QueueWorker fires every TICK_SECONDS; it does real work only when the object's
`pollingIntervalSeconds` has passed or its spec changed (kopf timers have a fixed interval, so the
per-object interval is checked here). Status goes through `patch.status`, never return values.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from . import metrics
from .kube import Kube, load_config
from .queuedb import QueueDatabases
from .reconcile import ObjectMemory, QueueWorkerObject, Reconciler
from .spec import GROUP, PLURAL, VERSION

TICK_SECONDS = 0.5
MEMORY_KEY = "queueworker_memory"


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.WARNING  # Events come from the reconciler, not from log lines
    settings.watching.server_timeout = 300
    memo.reconciler = Reconciler(Kube(load_config()), QueueDatabases())


@kopf.on.cleanup()
async def close_databases(memo: kopf.Memo, **_: Any) -> None:
    memo.reconciler.databases.close()


@kopf.timer(GROUP, VERSION, PLURAL, interval=TICK_SECONDS, backoff=TICK_SECONDS * 4)
async def scaling_tick(name: str, namespace: str, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status,
                       body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    reconciler: Reconciler = memo.reconciler
    memory: ObjectMemory = memo.setdefault(MEMORY_KEY, ObjectMemory())
    obj = QueueWorkerObject(name, namespace, meta["uid"], int(meta.get("generation", 0)), dict(spec), dict(status))
    if not reconciler.due(obj, memory):
        return
    result = await reconciler.tick(obj, memory)
    patch.status.update(result.status)
    for event in result.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
async def forget(name: str, namespace: str, **_: Any) -> None:
    """The Deployment goes with its owner (garbage collection); only our metrics need dropping."""
    metrics.forget(namespace, name)
