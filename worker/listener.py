"""LISTEN/NOTIFY wake-ups for idle workers.

Producers send one notification per queue per statement: `queue` when tasks are due now,
`queue <epoch>` when the batch is only due later. The listener turns those into a wake-up
now or a timed wake-up, and asks for one poll after every (re)connect, since notifications
sent while it was disconnected are lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

from . import db, sql
from .backoff import error_wait

log = logging.getLogger("queueworker.listener")


class Listener:
    def __init__(self, dsn: str, queues: tuple[str, ...], wake: Callable[[float], None]):
        self._dsn = dsn
        self._queues = set(queues)
        self._wake = wake  # called with the epoch time at which work is due (<= now: at once)

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                conn = await db.connect(self._dsn, "queueworker-listen")
            except psycopg.Error as exc:
                failures += 1
                log.warning("listener cannot connect: %s", exc)
                await asyncio.sleep(error_wait(failures))
                continue
            try:
                await conn.execute(f"LISTEN {sql.NOTIFY_CHANNEL}")
                failures = 0
                self._wake(0.0)  # anything enqueued while we were not listening
                async for notify in conn.notifies():
                    self._handle(notify.payload)
            except psycopg.Error as exc:
                failures += 1
                log.warning("listener connection lost: %s", exc)
                await asyncio.sleep(error_wait(failures))
            finally:
                await conn.close()

    def _handle(self, payload: str) -> None:
        queue, _, due = payload.partition(" ")
        if queue not in self._queues:
            return
        try:
            self._wake(float(due) if due else 0.0)
        except ValueError:
            log.warning("ignoring malformed notification %r", payload)

