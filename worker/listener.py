"""LISTEN/NOTIFY wake-ups for idle workers, and cancellations of running tasks.

Producers send one notification per queue per statement: `queue` when tasks are due now,
`queue <epoch>` when the batch is only due later. The listener turns those into a wake-up
now or a timed wake-up, and asks for one poll, one scheduler pass and one look at the settings
after every (re)connect, since notifications sent while it was not listening are lost. A
cancellation of a running task names the worker that holds it; that worker stops the handler at
once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import psycopg

from . import db, metrics, sql
from .events import parse_announcement
from . import dsn as dsn_text

log = logging.getLogger("queueworker.listener")


class Listener:
    def __init__(self, dsn: str, queues: tuple[str, ...], wake: Callable[[float], None], worker_id: str,
                 on_cancel: Callable[[int, int], None], on_settings: Callable[[], None],
                 on_listening: Callable[[], None]):
        self._dsn = dsn
        self._queues = set(queues)
        self._wake = wake  # called with the epoch time at which work is due (<= now: at once)
        self._worker_id = worker_id
        self._on_cancel = on_cancel  # called with (task id, lease token) of a task of ours cancelled
        self._on_settings = on_settings  # a queue's flow-control settings changed
        # Listening (again): whatever was announced before is lost, so look again at everything
        # a notification could have said (tasks due now or later, settings).
        self._on_listening = on_listening

    async def step(self) -> float:
        """Listens until the connection is lost, then returns to reconnect at once: a listener that
        has been listening is healthy, and its next connection failure starts a fresh ErrorWait.
        Failing to connect or to LISTEN raises (the supervisor waits and retries). Notifications
        for queues this worker does not work are ignored."""
        conn = await db.connect(self._dsn, "queueworker-listen")
        try:
            await conn.execute(f"LISTEN {sql.NOTIFY_CHANNEL}")
            await conn.execute(f"LISTEN {sql.CANCEL_CHANNEL}")
            await conn.execute(f"LISTEN {sql.QUEUES_CHANNEL}")
            self._on_listening()
            try:
                async for notify in conn.notifies():
                    if notify.channel == sql.CANCEL_CHANNEL:
                        self._handle_cancel(notify.payload)
                    elif notify.channel == sql.QUEUES_CHANNEL:
                        if notify.payload in self._queues:
                            self._on_settings()
                    else:
                        self._handle(notify.payload)
            except psycopg.OperationalError as exc:
                metrics.DB_ERRORS.labels("listen").inc()
                log.warning("listener connection lost, reconnecting: %s", dsn_text.explain(exc, self._dsn))
        finally:
            await conn.close()
        return 0.0

    def _handle(self, payload: str) -> None:
        queue = payload.partition(" ")[0]
        if queue not in self._queues:
            return
        announced = parse_announcement(payload)
        if announced is None:  # never from queueworker: garbage is ignored
            log.warning("ignoring malformed notification for queue %s", queue)
            return
        self._wake(announced[1])

    def _handle_cancel(self, payload: str) -> None:
        """`worker-id task-id lease-token`: ours only. A cancellation missed while disconnected is
        found by the next heartbeat (the lease is gone)."""
        worker, _, rest = payload.partition(" ")
        if worker != self._worker_id:
            return
        try:
            task_id, token = (int(part) for part in rest.split(" "))
        except ValueError:
            log.warning("ignoring malformed cancellation notice")
            return
        self._on_cancel(task_id, token)
