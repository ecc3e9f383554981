"""Heartbeats: one statement per interval extends every lease this worker still holds and
refreshes its `workers` row. Leases the database no longer grants are reported as lost."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from . import __version__, metrics, sql
from .attempt import Attempt
from .backoff import error_wait
from .db import DutyConnection
from .events import wait_event

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


class Heartbeater:
    def __init__(self, conn: DutyConnection, identity: WorkerIdentity, interval: float, lease_seconds: float,
                 held: Callable[[], list[Attempt]], draining: Callable[[], bool],
                 on_lost: Callable[[list[Attempt]], None]):
        self._conn = conn
        self._identity = identity
        self._interval = interval
        self._lease_seconds = lease_seconds
        self._held = held
        self._draining = draining
        self._on_lost = on_lost
        self._now = asyncio.Event()

    def beat_soon(self) -> None:
        self._now.set()

    async def beat(self) -> None:
        """Registers or refreshes the worker row and extends held leases; reports lost ones."""
        held = self._held()
        ident = self._identity
        rows = await self._conn.fetch(sql.HEARTBEAT, {
            "worker": ident.id, "hostname": ident.hostname, "pod_name": ident.pod_name,
            "pod_namespace": ident.pod_namespace, "pid": ident.pid, "queues": list(ident.queues),
            "concurrency": ident.concurrency, "running": len(held), "draining": self._draining(),
            "version": __version__, "lease_seconds": self._lease_seconds,
            "ids": [a.id for a in held], "tokens": [a.token for a in held]})
        still_held = {row[0] for row in rows}
        lost = [a for a in held if a.id not in still_held and not a.reporting and not a.abandoned]
        if lost:
            self._on_lost(lost)

    async def run(self) -> None:
        failures = 0
        while True:
            await wait_event(self._now, self._interval if not failures else error_wait(failures))
            self._now.clear()
            try:
                await self.beat()
                failures = 0
            except psycopg.Error as exc:
                failures += 1
                metrics.DB_ERRORS.labels("heartbeat").inc()
                log.warning("heartbeat failed: %s", exc)
