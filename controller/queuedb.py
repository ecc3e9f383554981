"""Reading queue depth and worker leases from Postgres, gently.

One small pool per distinct database (not per QueueWorker), a short connect timeout and a
`statement_timeout` on every session, and depth reads coalesced: QueueWorkers that poll the same
database at about the same moment share one `QUEUE_DEPTH` query for all their queues. The blocking
psycopg calls run in threads so kopf's event loop never waits on the database.

Each database also gets one LISTEN connection on the producers' NOTIFY channel, so a backlog
that appears between two polls is noticed at once (the reconciler decides what to do with that).
Without it (e.g. behind a transaction-pooling PgBouncer) polling alone still works.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from queueworker import sql

from .policy import QueueDepth

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 3
STATEMENT_TIMEOUT_MS = 2000
POOL_SIZE = 2
# How long a read waits for other QueueWorkers on the same database to join its query.
COALESCE_SECONDS = 0.02
SESSION_OPTIONS = f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c idle_in_transaction_session_timeout=10000"
LISTEN_RETRY_MAX_SECONDS = 30


class SmallPool:
    """At most POOL_SIZE idle autocommit connections to one database; a connection that errs is
    dropped, so a restarted server costs one failed query, not a stuck pool."""

    def __init__(self, dsn: str):
        self._dsn = dsn
        self._idle: list[psycopg.Connection] = []
        self._lock = threading.Lock()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None or conn.closed:
            conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                                   options=SESSION_OPTIONS, application_name="queueworker-controller")
        try:
            yield conn
        except BaseException:
            conn.close()
            raise
        with self._lock:
            if len(self._idle) < POOL_SIZE:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


@dataclass(frozen=True)
class WorkerLease:
    pod_name: str
    running: int
    draining: bool
    oldest_lease_age_seconds: float | None


class QueueDatabases:
    """Every database the controller reads, keyed by connection URL."""

    def __init__(self) -> None:
        self._pools: dict[str, SmallPool] = {}
        self._batches: dict[str, _DepthBatch] = {}
        self._query_locks: dict[str, asyncio.Lock] = {}
        self._listeners: dict[str, asyncio.Task[None]] = {}
        self._notified: dict[tuple[str, str], float] = {}  # (dsn, queue) -> monotonic time of last NOTIFY

    def pool(self, dsn: str) -> SmallPool:
        if dsn not in self._pools:
            self._pools[dsn] = SmallPool(dsn)
        return self._pools[dsn]

    async def depth(self, dsn: str, queue: str, cap: int) -> QueueDepth:
        """The queue's depth, ready and retrying counted up to `cap`. Raises psycopg.Error."""
        batch = self._batches.get(dsn)
        if batch is None or batch.started:
            lock = self._query_locks.setdefault(dsn, asyncio.Lock())
            batch = self._batches[dsn] = _DepthBatch(self.pool(dsn), lock)
            asyncio.get_running_loop().call_later(COALESCE_SECONDS, batch.start)
        return await batch.add(queue, cap)

    async def worker_leases(self, dsn: str, namespace: str, queue: str) -> list[WorkerLease]:
        def read() -> list[WorkerLease]:
            with self.pool(dsn).connection() as conn:
                rows = conn.execute(sql.WORKER_LEASES, {"namespace": namespace, "queue": queue}).fetchall()
            return [WorkerLease(*row) for row in rows]
        return await asyncio.to_thread(read)

    def listen(self, dsn: str) -> None:
        """Starts listening for new tasks on this database, once."""
        if dsn not in self._listeners:
            self._listeners[dsn] = asyncio.ensure_future(self._listen(dsn))

    def notified_since(self, dsn: str, queue: str, since: float) -> bool:
        """Whether tasks were enqueued on `queue` after monotonic time `since`."""
        return self._notified.get((dsn, queue), float("-inf")) > since

    async def _listen(self, dsn: str) -> None:
        failures = 0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                        dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS, options=SESSION_OPTIONS,
                        application_name="queueworker-controller-listen",
                        keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3) as conn:
                    await conn.execute(f"LISTEN {sql.NOTIFY_CHANNEL}")
                    failures = 0
                    async for notify in conn.notifies():
                        if " " not in notify.payload:  # "queue due_epoch" announces tasks due later
                            self._notified[(dsn, notify.payload)] = time.monotonic()
            except psycopg.Error as exc:
                failures += 1
                log.debug("LISTEN connection failed (%s); polling only until it is back", exc)
                await asyncio.sleep(min(LISTEN_RETRY_MAX_SECONDS, 2 ** failures))

    def close(self) -> None:
        for task in self._listeners.values():
            task.cancel()
        self._listeners.clear()
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


class _DepthBatch:
    """Queues asked for on one database within COALESCE_SECONDS, or while the previous batch's
    query runs, answered by one query: at most one depth query per database at a time."""

    def __init__(self, pool: SmallPool, lock: asyncio.Lock):
        self._pool = pool
        self._lock = lock
        self._waiters: dict[str, list[asyncio.Future[QueueDepth]]] = {}
        self._cap = 1
        self.started = False  # once true, later reads go to a new batch

    def add(self, queue: str, cap: int) -> asyncio.Future[QueueDepth]:
        future: asyncio.Future[QueueDepth] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(queue, []).append(future)
        self._cap = max(self._cap, cap)
        return future

    def start(self) -> None:
        asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            async with self._lock:
                self.started = True
                rows = await asyncio.to_thread(self._query)
        except Exception as exc:  # noqa: BLE001 - every waiter gets the error to report
            for futures in self._waiters.values():
                for future in futures:
                    if not future.done():
                        future.set_exception(exc)
            return
        for queue, futures in self._waiters.items():
            for future in futures:
                if not future.done():
                    future.set_result(rows[queue])

    def _query(self) -> dict[str, QueueDepth]:
        with self._pool.connection() as conn:
            rows = conn.execute(sql.QUEUE_DEPTH, {"queues": list(self._waiters), "cap": self._cap}).fetchall()
        return {queue: QueueDepth(int(ready), int(running), int(retrying), age)
                for queue, ready, running, retrying, age in rows}
