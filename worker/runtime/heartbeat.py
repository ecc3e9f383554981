"""Heartbeats and self-fencing.

One statement per interval extends every lease this worker still holds, records the progress
their handlers last reported, and refreshes its `workers` row; leases the database no longer
grants are reported as lost. Between heartbeats,
each attempt also knows when its lease runs out by this worker's own clock (the last heartbeat
that extended it, plus the lease): when heartbeats fail — the database unreachable from this
worker only — attempts whose lease has passed are cancelled before another worker can rescue and
re-run them, which bounds duplicate work to about one lease.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import metrics
from .._version import __version__
from .attempt import Attempt
from ..db.connection import DutyConnection
from ..db.lease import (CANCELLED_AMONG, HEARTBEAT, REGISTER_WORKER, CancelledAmongParams, HeartbeatParams,
                        RegisterWorkerParams)
from .handlers import CANCELLED, LEASE_LOST

log = logging.getLogger("queueworker.heartbeat")


@dataclass(frozen=True)
class WorkerIdentity:
    """Who a worker process is: a random id per start (never the pod name), plus where it runs."""

    id: uuid.UUID
    hostname: str
    pod_name: str | None
    pod_namespace: str | None
    pid: int
    queues: tuple[str, ...]
    concurrency: int

    @classmethod
    def for_this_process(cls, queues: tuple[str, ...], concurrency: int) -> WorkerIdentity:
        return cls(uuid.uuid4(), socket.gethostname(), os.environ.get("POD_NAME") or None,
                   os.environ.get("POD_NAMESPACE") or None, os.getpid(), queues, concurrency)


def fence_margin(lease_seconds: float) -> float:
    """How long before its lease runs out (by our clock) an attempt is cancelled: a tenth of the
    lease, at least half a second, so it stops before any rescuer may take the task."""
    return max(0.5, lease_seconds / 10)


class Heartbeater:
    """Beats on the first of `conns` (the duty connection); on the next one (the outcome
    connection) when a statement holds the first and none holds that one: a beat never waits
    behind a completion, and a claim or a slow housekeeping statement does not hold it back either."""

    def __init__(self, conns: tuple[DutyConnection, ...], identity: WorkerIdentity, interval: float, lease_seconds: float,
                 held: Callable[[], list[Attempt]], draining: Callable[[], bool], can_claim: Callable[[], bool],
                 on_lost: Callable[[list[Attempt], str, str], None]):
        self._conns = conns
        self._identity = identity
        self.interval = interval
        self._lease_seconds = lease_seconds
        self._held = held
        self._draining = draining
        self._can_claim = can_claim
        self._on_lost = on_lost
        self.now = asyncio.Event()  # wakes the heartbeat duty for a beat at once
        self._skipping = False

    def beat_soon(self) -> None:
        self.now.set()

    def _worker_row(self, running: int) -> dict[str, Any]:
        """The worker's `workers` row: RegisterWorkerParams, and the first fields of HeartbeatParams."""
        ident = self._identity
        return {"worker": ident.id, "hostname": ident.hostname, "pod_name": ident.pod_name,
                "pod_namespace": ident.pod_namespace, "pid": ident.pid, "queues": list(ident.queues),
                "concurrency": ident.concurrency, "running": running, "draining": self._draining(),
                "version": __version__}

    async def register(self) -> None:
        """Registers the worker at start, before it claims: it holds no lease yet, so the heartbeat's
        lease update would have nothing to extend, and planning it on the partitioned table costs a
        new connection milliseconds before the first claim."""
        await self._conns[0].execute(REGISTER_WORKER, RegisterWorkerParams(**self._worker_row(running=0)),
                                 timeout=self.interval)

    async def beat(self) -> None:
        """Registers or refreshes the worker row and extends held leases; reports lost ones."""
        held = self._held()
        conn = self._free_conn()
        sent_at = asyncio.get_running_loop().time()  # the database extends from a later moment
        rows = await conn.fetch(HEARTBEAT, HeartbeatParams(
            **self._worker_row(running=len(held)), lease_seconds=self._lease_seconds,
            ids=[a.id for a in held], tokens=[a.token for a in held],
            progresses=[a.ctx.progress_json for a in held]), timeout=self.interval)
        still_held = {(row.id, row.lease_token): row.extended for row in rows}
        lost = []
        for attempt in held:
            extended = still_held.get(attempt.key)
            if extended:
                attempt.lease_expires = max(attempt.lease_expires, sent_at + self._lease_seconds)
            elif extended is None and not attempt.reporting and not attempt.abandoned:
                lost.append(attempt)
        if lost:
            cancelled = {row.id for row in await conn.fetch(CANCELLED_AMONG, CancelledAmongParams(
                ids=[attempt.id for attempt in lost]), timeout=self.interval)}
            for reason, stop_reason, attempts in (
                    ("the task was cancelled", CANCELLED, [a for a in lost if a.id in cancelled]),
                    ("lease lost (expired or re-claimed)", LEASE_LOST, [a for a in lost if a.id not in cancelled])):
                if attempts:
                    self._on_lost(attempts, reason, stop_reason)

    def _free_conn(self) -> DutyConnection:
        """The first connection no statement holds; the first one when all are held."""
        return next((conn for conn in self._conns if not conn.busy()), self._conns[0])

    async def step(self) -> float:
        """One pass of the heartbeat duty. A worker whose claim loop is failing does not heartbeat:
        it must not look alive to anyone while it cannot take work."""
        if self._can_claim():
            if self._skipping:
                log.info("claiming works again: heartbeats resume")
                self._skipping = False
            await self.beat()
        elif not self._skipping:
            log.error("claiming is failing: heartbeats stop until it works again")
            self._skipping = True
        return self.interval

    def fence(self) -> float:
        """One pass of the fence duty: cancels attempts whose lease has passed by our own clock.
        Returns the seconds until the next pass."""
        now = asyncio.get_running_loop().time()
        margin = fence_margin(self._lease_seconds)
        expired = [a for a in self._held() if not a.reporting and not a.abandoned and now >= a.lease_expires - margin]
        if expired:
            metrics.ATTEMPTS_FENCED.inc(len(expired))
            self._on_lost(expired, "its lease ran out by this worker's clock (no heartbeat extended it in time)",
                          LEASE_LOST)
        return min(1.0, margin)
